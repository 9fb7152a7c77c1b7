//! A hold's life after its acquire: the monitor that watches it until it ends ([`monitor`]), every
//! way it ends ([`ending`]: release, heartbeat, loss, shutdown; [`deadline`]: its maximum hold
//! time), and the writes that must
//! outlive the request that asked for them ([`detached`], [`late`]).

pub(super) mod deadline;
pub(super) mod detached;
pub(super) mod ending;
pub(super) mod late;
pub(super) mod monitor;
