//! The fence-check workload, in the way Jepsen's etcd `lock-set` test works: before its write
//! to the fenced counter, each mutex holder asks its sidecar whether its token is current
//! (`GET /v1/locks/counter/fence?token=N`) and, if so, writes to a register that keeps no token
//! and so cannot refuse a stale write. A check and a write are two steps: a holder paused
//! between them (the fault loop's pauses sit exactly there) writes after a later holder did. The
//! run reports the register's writes out of token order beside the fenced counter's, whose
//! compare-and-set of the token refuses them (it must have none).

use std::sync::Mutex;

/// The register: the tokens of the writes it took, in the order it took them.
#[derive(Debug, Default)]
pub struct Register(Mutex<Vec<i64>>);

impl Register {
    /// Takes a write made under `token`.
    pub fn write(&self, token: i64) {
        self.0.lock().unwrap().push(token);
    }

    /// How many writes it took, and how many of them came after a write with a higher token.
    pub fn out_of_order(&self) -> (usize, usize) {
        let writes = self.0.lock().unwrap();
        let mut highest = i64::MIN;
        let late = writes.iter().filter(|&&t| {
            let behind = t < highest;
            highest = highest.max(t);
            behind
        });
        (writes.len(), late.count())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_below_an_earlier_token_is_out_of_order() {
        let r = Register::default();
        for t in [3, 5, 4, 7, 7, 6] {
            r.write(t);
        }
        assert_eq!(r.out_of_order(), (6, 2));
    }
}
