//! The engine's own log lines in a seed's trace (`PODLOCK_WORLD_LOG`, a tracing filter such as
//! `podlock=debug`): to find where two runs of a seed part, below what the clients were told.

use super::World;
use std::io;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

/// Writes each log line into the world's trace.
#[derive(Clone)]
struct Lines(World);

impl io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let line = String::from_utf8_lossy(buf);
        self.0.log(format!("log {}", line.trim_end()));
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Lines {
    type Writer = Lines;

    fn make_writer(&'a self) -> Lines {
        self.clone()
    }
}

/// With `PODLOCK_WORLD_LOG` set, the engine's log lines go to `world`'s trace on this thread
/// until the guard is dropped.
pub fn capture(world: &World) -> Option<tracing::subscriber::DefaultGuard> {
    let filter = std::env::var("PODLOCK_WORLD_LOG").ok()?;
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::new(filter))
        .without_time()
        .with_ansi(false)
        .with_writer(Lines(world.clone()))
        .finish();
    Some(tracing::subscriber::set_default(subscriber))
}
