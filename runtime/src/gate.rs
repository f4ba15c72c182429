//! Debug builds only: tests hold a stage at one instant of its work, to change the world
//! there (rewrite a source file, run another stage beside it, kill it). With `VAR=DIR` (or
//! `VAR=POINT:DIR` for a gate with several points) the stage creates `DIR/reached` and waits,
//! two minutes at most, for the test to create `DIR/go`. Release builds have no gates.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long a gate waits for its `go` at most: a test that forgot it fails, it does not hang.
const HOLD_AT_MOST: Duration = Duration::from_secs(120);

/// The gate's directory when `var` names this `point` (None: any point, `VAR=DIR`).
pub fn dir(var: &str, point: Option<&str>) -> Option<PathBuf> {
    let v = std::env::var(var).ok().filter(|v| !v.is_empty())?;
    match point {
        None => Some(PathBuf::from(v)),
        Some(point) => {
            let (at, dir) = v.split_once(':')?;
            (at == point).then(|| PathBuf::from(dir))
        }
    }
}

/// Says the gate is reached and waits for `go` (blocking: for a split on a blocking thread).
pub fn hold(dir: &Path) {
    let _ = std::fs::write(dir.join("reached"), b"");
    let t = Instant::now();
    while !dir.join("go").exists() && t.elapsed() < HOLD_AT_MOST {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// [`hold`] on the runtime, without taking a thread.
pub async fn hold_async(dir: &Path) {
    let _ = std::fs::write(dir.join("reached"), b"");
    let t = Instant::now();
    while !dir.join("go").exists() && t.elapsed() < HOLD_AT_MOST {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
