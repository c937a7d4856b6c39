//! `KUBEBUILDER_ASSETS`: setup-envtest's binaries are used where they are,
//! and a directory that lacks them is reported, never built into. (A test
//! binary of its own: it sets process-wide environment variables.)

use kinformer_envtest::{Binaries, EnvtestError};

#[test]
#[allow(unsafe_code)] // std::env::set_var: see the SAFETY comments.
fn kubebuilder_assets_are_used_as_they_are_and_never_built_into() {
    // The binaries this crate builds (or finds), linked into a setup-envtest
    // style directory.
    let built = Binaries::ensure().unwrap();
    let assets = tempfile::tempdir().unwrap();
    for name in ["etcd", "kube-apiserver", "kubectl"] {
        std::os::unix::fs::symlink(built.dir.join(name), assets.path().join(name)).unwrap();
    }
    // SAFETY: this test binary runs this one test; no other thread reads
    // or writes the environment meanwhile.
    unsafe {
        std::env::remove_var("KINFORMER_ENVTEST_BIN");
        std::env::set_var("KUBEBUILDER_ASSETS", assets.path());
    }
    let found = Binaries::ensure().unwrap();
    assert_eq!(found.dir, assets.path());
    assert!(found.kube_apiserver().starts_with(assets.path()));

    // An assets directory without the binaries: an error naming what is
    // missing, and nothing written there.
    let empty = tempfile::tempdir().unwrap();
    // SAFETY: as above.
    unsafe { std::env::set_var("KUBEBUILDER_ASSETS", empty.path()) };
    match Binaries::ensure() {
        Err(EnvtestError::NotBuilt(path)) => assert!(path.starts_with(empty.path()), "{path:?}"),
        other => panic!("expected NotBuilt, got {other:?}"),
    }
    assert_eq!(
        std::fs::read_dir(empty.path()).unwrap().count(),
        0,
        "built into the user's directory"
    );

    // KINFORMER_ENVTEST_BIN wins over KUBEBUILDER_ASSETS.
    // SAFETY: as above.
    unsafe { std::env::set_var("KINFORMER_ENVTEST_BIN", &built.dir) };
    assert_eq!(Binaries::ensure().unwrap().dir, built.dir);
}
