//! Child processes of the control plane: own process group, output to a log
//! file, SIGTERM then SIGKILL on drop.
//!
//! Children are spawned from one long-lived thread with
//! `PR_SET_PDEATHSIG=SIGKILL`: the kernel kills them when that thread dies,
//! which happens only when the whole test process exits or is killed, so a
//! control plane can never outlive the process that started it, even one kept
//! in a `static` that is never dropped.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::EnvtestError;

/// A running component of the control plane.
pub(crate) struct Process {
    pub component: &'static str,
    child: Child,
    pub log: PathBuf,
}

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

fn spawner() -> &'static mpsc::Sender<SpawnRequest> {
    static SPAWNER: OnceLock<mpsc::Sender<SpawnRequest>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("envtest-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
                // The channel lives in a static and is never closed: this
                // thread, and with it the children, end with the process.
            })
            .map(|_| ())
            .unwrap_or_else(|e| eprintln!("envtest: cannot start the spawner thread: {e}"));
        tx
    })
}

impl Process {
    pub(crate) fn spawn(
        component: &'static str,
        binary: &Path,
        args: &[String],
        log: PathBuf,
    ) -> Result<Self, EnvtestError> {
        let out = File::create(&log).map_err(|e| EnvtestError::io("creating", &log, e))?;
        let err = out
            .try_clone()
            .map_err(|e| EnvtestError::io("opening", &log, e))?;
        let mut cmd = Command::new(binary);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        #[allow(unsafe_code)]
        // SAFETY: the closure runs in the forked child before exec, where
        // only async-signal-safe calls are sound: prctl is one, allocates
        // nothing and touches no memory of ours; reading errno is too.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let (tx, rx) = mpsc::channel();
        let spawn_error = |source| EnvtestError::Spawn {
            component,
            path: binary.to_owned(),
            source,
        };
        spawner()
            .send((cmd, tx))
            .map_err(|_| spawn_error(std::io::Error::other("spawner thread is gone")))?;
        let child = rx
            .recv()
            .map_err(|_| spawn_error(std::io::Error::other("spawner thread is gone")))?
            .map_err(spawn_error)?;
        Ok(Self {
            component,
            child,
            log,
        })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status, if the process has exited.
    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The last `lines` lines of the log.
    pub(crate) fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log, lines)
    }

    /// SIGTERM to the process group, SIGKILL after `grace`, then reap.
    pub(crate) fn stop(&mut self, grace: Duration) {
        if self.exited().is_some() {
            return;
        }
        let pgid = self.child.id() as libc::pid_t;
        #[allow(unsafe_code)]
        // SAFETY: kill(2) takes no pointers. The group is ours: the child
        // leads it (process_group(0)) and is not yet reaped, so its id
        // cannot have been reused.
        unsafe {
            libc::kill(-pgid, libc::SIGTERM);
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if self.exited().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        #[allow(unsafe_code)]
        // SAFETY: as above; the leader is still not reaped.
        unsafe {
            libc::kill(-pgid, libc::SIGKILL);
        }
        let _ = self.child.wait();
    }

    /// Peak resident memory (VmHWM) in bytes, while the process runs.
    pub(crate) fn peak_rss_bytes(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

pub(crate) fn log_tail(path: &Path, lines: usize) -> String {
    let Ok(mut f) = File::open(path) else {
        return String::from("(no log)");
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut bytes = Vec::new();
    let _ = f.read_to_end(&mut bytes);
    let buf = String::from_utf8_lossy(&bytes);
    let all: Vec<&str> = buf.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
