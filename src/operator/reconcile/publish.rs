//! Publishing a DistributedLock's settings to etcd under the token epoch [`epoch::choose`]
//! picks. A new epoch is recorded in the status (`fencingEpoch`) before etcd gets it, so that
//! no epoch whose tokens may have been handed out is ever chosen again, whatever happens to
//! etcd after; it comes with the removal of the lock's queue (a key enqueued under the old
//! epoch must not be granted under it), a log line and an Event naming the cause.

use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::events::EventType;
use tracing::{info, warn};

use crate::crd::{DistributedLock, DistributedLockStatus};
use crate::lock::protocol::epoch::{self, Choice, Known, Renewal};
use crate::lock::{LockError, LockId, LockState, Settings, Token, may_publish};
use crate::operator::context::{Context, event};
use crate::operator::reconcile_error::Error;

/// How many times a publish is tried while the settings change under it (another replica, or
/// `podlock declare`): each try reads them again and decides again.
const ATTEMPTS: usize = 4;

/// The Event reason of a lock moved to a new epoch.
pub const NEW_EPOCH: &str = "NewFencingEpoch";

/// Makes etcd have the spec's settings under the epoch the rule picks (unless it has them
/// already, or another cluster sharing the lock etcd published them: see [`may_publish`]);
/// returns the lock as etcd has it then. Fencing outranks the publisher rule: when this
/// cluster's status says the tokens another cluster's settings hand out fall below ones handed
/// out before (its status behind ours after etcd was wiped twice), the operator moves those
/// settings, as they are, to a new epoch (see [`Target`]).
pub async fn settings(
    ctx: &Context,
    api: &Api<DistributedLock>,
    dl: &DistributedLock,
    id: &LockId,
) -> Result<LockState, Error> {
    ctx.store.declare_in(id, &ctx.cluster).await?;
    let mut status = dl.status.clone();
    let mut fresh = false;
    for _ in 0..ATTEMPTS {
        let state = ctx.store.lock_state(id, dl.spec.settings().max_holders).await?;
        let target = Target::of(ctx, dl, &state);
        let at = (state.revision, !target.theirs && ctx.returned.pending(id));
        let mut choice = choose(id, status.as_ref(), state.epoch(), at)?;
        if !fresh && target.wants(&state, choice) {
            // Whatever is written now rests on the epochs recorded: decide on the status as
            // the API server has it, not on a cache that may lag the operator's last write.
            status = api.get_status(&dl.name_any()).await?.status;
            fresh = true;
            choice = choose(id, status.as_ref(), state.epoch(), at)?;
        }
        if !target.wants(&state, choice) {
            if target.theirs {
                ctx.returned.done(id); // the publisher's operator sees the restore for itself
            }
            return Ok(state);
        }
        if status.as_ref().and_then(|s| s.fencing_epoch) < Some(choice.epoch) {
            status = Some(record_epoch(ctx, id, status, choice.epoch).await?);
        }
        let want = target.settings(choice);
        let (over, renew) = (state.settings_revision, choice.renewal.is_some());
        if let Some(ended) = ctx
            .store
            .publish(id, &want, &target.publisher, over, renew)
            .await?
        {
            ctx.returned.done(id);
            announce(ctx, dl, id, (&want, &target), choice, ended).await;
        }
    }
    Err(Error::SettingsChanging(id.clone()))
}

/// What a reconcile may write: this spec's settings as this cluster, or, when another cluster
/// published the settings etcd has, only those settings under a new epoch, in that cluster's
/// name, and only when the tokens they hand out would fall (fencing outranks the publisher
/// rule; the edges review's finding 6: docs/design.md, "Where the engine and the model part
/// ways").
struct Target {
    base: Settings,
    publisher: String,
    /// Whether the base is another cluster's settings (that cluster is then `publisher`).
    theirs: bool,
}

impl Target {
    fn of(ctx: &Context, dl: &DistributedLock, state: &LockState) -> Target {
        match state.settings {
            Some(theirs) if !may_publish(&state.publisher, &ctx.cluster) => Target {
                base: theirs,
                publisher: state.publisher.clone(),
                theirs: true,
            },
            _ => Target {
                base: dl.spec.settings(),
                publisher: ctx.cluster.clone(),
                theirs: false,
            },
        }
    }

    /// The settings to publish under `choice`.
    fn settings(&self, choice: Choice) -> Settings {
        Settings {
            epoch: choice.epoch,
            ..self.base
        }
    }

    /// Whether etcd's settings (in `state`) must be written under `choice`.
    fn wants(&self, state: &LockState, choice: Choice) -> bool {
        let fencing = matches!(
            choice.renewal,
            Some(Renewal::WentBack { .. } | Renewal::OlderEpoch { .. })
        );
        (!self.theirs || fencing) && state.settings != Some(self.settings(choice))
    }
}

/// [`epoch::choose`] for a lock whose status is `status`, its error named for the lock.
fn choose(
    id: &LockId,
    status: Option<&DistributedLockStatus>,
    found: Option<u32>,
    at: (i64, bool),
) -> Result<Choice, Error> {
    let known = Known {
        published: status.and_then(|s| s.fencing_epoch),
        token: status.and_then(|s| s.fencing_token).map(Token::from_raw),
    };
    epoch::choose(known, found, at).map_err(|source| {
        Error::Lock(LockError::Token {
            lock: id.clone(),
            source,
        })
    })
}

/// Records `epoch` as `status.fencingEpoch`, before etcd gets it; returns the status written.
async fn record_epoch(
    ctx: &Context,
    id: &LockId,
    status: Option<DistributedLockStatus>,
    epoch: u32,
) -> Result<DistributedLockStatus, Error> {
    let old = status.unwrap_or_default();
    let status = DistributedLockStatus {
        phase: old.phase.clone().or(Some("Pending".into())),
        fencing_epoch: Some(epoch),
        ..old
    };
    ctx.status.write_now(id, status.clone()).await?;
    Ok(status)
}

/// Logs the settings published; a new epoch also gets a warning and an Event.
async fn announce(
    ctx: &Context,
    dl: &DistributedLock,
    id: &LockId,
    (want, target): (&Settings, &Target),
    choice: Choice,
    ended: i64,
) {
    let Some(renewal) = choice.renewal else {
        info!(lock = %id, ?want, "published settings");
        return;
    };
    let floor = Token::new(choice.epoch, 0).map_or(0, Token::get);
    let over = match target.theirs {
        true => format!(
            " (over the settings cluster {} published, which this cluster's status shows behind)",
            target.publisher
        ),
        false => String::new(),
    };
    let note = format!(
        "{renewal}; fencing tokens continue at epoch {} (above {floor}){over}; {ended} holds \
         and waits of the old epoch ended",
        choice.epoch
    );
    warn!(lock = %id, epoch = choice.epoch, ended, "{note}");
    event(ctx, dl, EventType::Warning, NEW_EPOCH, note).await;
}
