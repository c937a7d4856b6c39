//! The few etcd calls the harness makes (health, revision, compaction),
//! over etcd's JSON gateway with a minimal HTTP/1.1 client on loopback.

use std::time::Duration;

use base64::Engine;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::EnvtestError;

/// Sends one request and returns the status code and body.
pub(crate) async fn request(
    port: u16,
    method: &str,
    path: &'static str,
    body: Option<&str>,
) -> Result<(u16, String), EnvtestError> {
    let fail = |message: String| EnvtestError::Etcd {
        path,
        message,
        source: None,
    };
    let caused = |message: String, e: std::io::Error| EnvtestError::Etcd {
        path,
        message,
        source: Some(Box::new(e)),
    };
    let exchange = async {
        let mut stream = TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| caused(format!("connect to 127.0.0.1:{port}"), e))?;
        let body = body.unwrap_or("");
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        stream
            .write_all(req.as_bytes())
            .await
            .map_err(|e| caused("write".into(), e))?;
        let mut raw = Vec::new();
        stream
            .read_to_end(&mut raw)
            .await
            .map_err(|e| caused("read".into(), e))?;
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, rest) = text
            .split_once("\r\n\r\n")
            .ok_or_else(|| fail(format!("malformed response: {text:?}")))?;
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| fail(format!("malformed status line: {head:?}")))?;
        let body = if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            dechunk(rest)
        } else {
            rest.to_owned()
        };
        Ok((status, body))
    };
    tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .map_err(|_| fail("timed out after 10 s".into()))?
}

fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || tail.len() < n {
            break;
        }
        out.push_str(&tail[..n]);
        rest = tail[n..].trim_start_matches("\r\n");
    }
    out
}

/// Whether etcd answers `/health` with `"health":"true"`.
pub(crate) async fn healthy(port: u16) -> Result<(), String> {
    match request(port, "GET", "/health", None).await {
        Ok((200, body)) if body.contains("\"true\"") => Ok(()),
        Ok((status, body)) => Err(format!("/health answered {status}: {body}")),
        Err(e) => Err(crate::error::error_chain(&e)),
    }
}

/// The current revision of the etcd store.
pub(crate) async fn revision(port: u16) -> Result<i64, EnvtestError> {
    let key = base64::engine::general_purpose::STANDARD.encode("kinformer-envtest");
    let body = format!(r#"{{"key":"{key}"}}"#);
    let (status, text) = request(port, "POST", "/v3/kv/range", Some(&body)).await?;
    let fail = |message: String| EnvtestError::Etcd {
        path: "/v3/kv/range",
        message,
        source: None,
    };
    if status != 200 {
        return Err(fail(format!("status {status}: {text}")));
    }
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| EnvtestError::Etcd {
        path: "/v3/kv/range",
        message: format!("the answer is not JSON: {text}"),
        source: Some(Box::new(e)),
    })?;
    json["header"]["revision"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .ok_or_else(|| fail(format!("no header.revision in {text}")))
}

/// Compacts the store up to `revision`, discarding older history.
pub(crate) async fn compact(port: u16, revision: i64) -> Result<(), EnvtestError> {
    let body = format!(r#"{{"revision":"{revision}","physical":true}}"#);
    let (status, text) = request(port, "POST", "/v3/kv/compaction", Some(&body)).await?;
    if status != 200 {
        return Err(EnvtestError::Etcd {
            path: "/v3/kv/compaction",
            message: format!("status {status}: {text}"),
            source: None,
        });
    }
    Ok(())
}
