//! Wall time and CPU of one measured step: this process and the children it
//! reaped (ssh clients, ansible-playbook and its workers), and the whole
//! machine (which also counts the test hosts' sshd and whatever they run).

use std::time::Instant;

/// What one measured step cost.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Cost {
    /// Wall-clock seconds.
    pub wall_s: f64,
    /// User + system CPU seconds of this process and its reaped children.
    pub cpu_s: f64,
    /// Non-idle CPU seconds of the whole machine.
    pub machine_cpu_s: f64,
}

fn rusage_seconds(who: libc::c_int) -> f64 {
    // SAFETY: getrusage writes into the zeroed struct we own.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(who, &mut usage) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// User + system CPU seconds of the children this process has waited for
/// (and theirs): `ansible-playbook` and its workers once it has exited.
pub fn children_cpu() -> f64 {
    rusage_seconds(libc::RUSAGE_CHILDREN)
}

fn process_cpu() -> f64 {
    rusage_seconds(libc::RUSAGE_SELF) + rusage_seconds(libc::RUSAGE_CHILDREN)
}

/// Non-idle CPU seconds since boot, from the first line of `/proc/stat`.
fn machine_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<f64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal …: idle and iowait are
    // the machine waiting.
    let busy: f64 = fields
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4)
        .map(|(_, v)| v)
        .sum();
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    busy / ticks
}

/// A running measurement.
pub struct Meter {
    started: Instant,
    cpu: f64,
    machine: f64,
}

impl Meter {
    /// Starts measuring now.
    pub fn start() -> Meter {
        Meter {
            started: Instant::now(),
            cpu: process_cpu(),
            machine: machine_cpu(),
        }
    }

    /// What was spent since [`Meter::start`].
    pub fn stop(self) -> Cost {
        Cost {
            wall_s: self.started.elapsed().as_secs_f64(),
            cpu_s: process_cpu() - self.cpu,
            machine_cpu_s: machine_cpu() - self.machine,
        }
    }
}

/// The median of `values` (the mean of the middle two for an even count).
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn busy_work_is_measured() {
        let meter = Meter::start();
        let mut x = 0u64;
        for i in 0..50_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        std::hint::black_box(x);
        let cost = meter.stop();
        assert!(cost.cpu_s > 0.0, "{cost:?}");
        assert!(cost.machine_cpu_s > 0.0, "{cost:?}");
    }
}
