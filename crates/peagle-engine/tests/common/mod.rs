//! Shared helpers of the engine tests.

use std::path::PathBuf;

/// A checked-in fixture model or drafter under the repository's tests/fixtures.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}
