//! Where the machine's CPU went during a phase: the whole machine (`/proc/stat`) and each kind
//! of process (by its name in `/proc/PID/comm`), so that a lag can be placed: a machine with no
//! CPU to spare, or one component waiting on another while the CPU idles.

use crate::common::usage;

/// CPU seconds so far: the machine's busy and total time, and each named process kind's.
pub struct Cpu {
    busy: f64,
    total: f64,
    /// (name, CPU seconds) for each of [`KINDS`], then the operator's and this benchmark's.
    kinds: Vec<(&'static str, f64)>,
}

/// The processes of the control plane and podlock, by their `comm` name. Sidecars and the
/// operator are both `podlock`: the operator is counted on its own and taken out.
const KINDS: [&str; 3] = ["etcd", "kube-apiserver", "podlock"];

impl Cpu {
    /// The totals now; `operator` is the operator's pid.
    pub fn now(operator: i32) -> Cpu {
        let (busy, total) = machine();
        let mut kinds: Vec<(&'static str, f64)> = KINDS.iter().map(|k| (*k, by_name(k))).collect();
        let operator = usage(operator).1;
        kinds[2].1 -= operator;
        kinds[2].0 = "sidecars";
        kinds.push(("operator", operator));
        kinds.push(("benchmark", usage(std::process::id() as i32).1));
        Cpu { busy, total, kinds }
    }

    /// What was used since `before`, in cores: "machine 1.80 of 2 busy: etcd 0.52, ..., others
    /// 0.10" (others: whatever else ran on the machine).
    pub fn since(&self, before: &Cpu, secs: f64) -> String {
        let cores = (self.total - before.total) / secs;
        let busy = (self.busy - before.busy) / secs;
        let used: Vec<(&str, f64)> = (self.kinds.iter().zip(&before.kinds))
            .map(|((name, now), (_, then))| (*name, (now - then) / secs))
            .collect();
        let mut each: Vec<String> = used.iter().map(|(name, c)| format!("{name} {c:.2}")).collect();
        // The rest of the busy time: processes outside the benchmark (other users' builds).
        let others = busy - used.iter().map(|(_, c)| c).sum::<f64>();
        each.push(format!("others {:.2}", others.max(0.0)));
        format!("machine {busy:.2} of {cores:.0} busy: {}", each.join(", "))
    }
}

/// The machine's busy and total CPU seconds (every core), from the first line of `/proc/stat`.
fn machine() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<f64> = (stat.lines().next().unwrap_or("").split_whitespace().skip(1))
        .filter_map(|t| t.parse().ok())
        .collect();
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    // user nice system idle iowait irq softirq steal (guest time is in user already)
    let total: f64 = ticks.iter().take(8).sum();
    let idle = ticks.get(3).copied().unwrap_or(0.0) + ticks.get(4).copied().unwrap_or(0.0);
    ((total - idle) / hz, total / hz)
}

/// The CPU seconds of every running process named `name`.
pub fn by_name(name: &str) -> f64 {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    (dir.filter_map(Result::ok))
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim_end() == name)
        })
        .map(|pid| usage(pid).1)
        .sum()
}
