//! The filesystem provider against the suite; the second handle opens the same directory
//! again, as another process would.

use std::sync::Arc;

use ce_lock::LockProvider;
use ce_lock::filesystem::FilesystemProvider;

use crate::suite::Fixture;

fn make() -> Option<Fixture> {
    let dir = tempfile::tempdir().expect("tempdir");
    let open = || -> Arc<dyn LockProvider> {
        Arc::new(FilesystemProvider::open(&dir.path().join("locks")).expect("open lock dir"))
    };
    Some(Fixture {
        provider: open(),
        second: open(),
        keep: Some(Box::new(dir)),
    })
}

conformance_tests!(make);
