//! Scheduling policy: the order in which requests get compute and memory.
//!
//! Each step the core walks running requests in policy order (earlier ones get the
//! token budget and pages first; when pages run out, the last ones are preempted)
//! and admits waiting requests in the same order.

/// Which request goes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// First come, first served.
    #[default]
    Fcfs,
    /// Lower [`crate::Request::priority`] first; first come, first served among equals.
    Priority,
    /// Earliest estimated prompt completion first, had each request started when it
    /// arrived: arrival time plus the prompt compute it still needs (tokens left
    /// times the recent cost per token). Among requests that arrive together the
    /// one with the least prompt left goes first, which minimises their mean time to
    /// first token (several agents sending their next turns at once); a request
    /// that has waited longer than the extra work it brings goes before newer,
    /// shorter ones, so none starves.
    Shortest,
}

/// What the policy sees of a request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rank {
    /// Submission order.
    pub arrival: u64,
    /// The request's priority value.
    pub priority: i32,
    /// Microseconds after the engine started at which it arrived.
    pub arrived_us: u64,
}

impl Policy {
    /// Sort key: smaller runs first. `work_us`: the request's estimated
    /// microseconds of prompt computation left.
    pub(crate) fn key(self, r: Rank, work_us: u64) -> (i64, u64) {
        match self {
            Policy::Fcfs => (0, r.arrival),
            Policy::Priority => (i64::from(r.priority), r.arrival),
            Policy::Shortest => ((r.arrived_us + work_us) as i64, r.arrival),
        }
    }

    /// Parses `fcfs`, `priority` or `shortest`.
    pub fn parse(s: &str) -> Option<Policy> {
        match s {
            "fcfs" => Some(Policy::Fcfs),
            "priority" => Some(Policy::Priority),
            "shortest" => Some(Policy::Shortest),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders() {
        let a = Rank {
            arrival: 1,
            priority: 5,
            arrived_us: 0,
        };
        let b = Rank {
            arrival: 2,
            priority: -1,
            arrived_us: 1_000_000,
        };
        let (wa, wb) = (9_000_000, 2_000_000);
        assert!(Policy::Fcfs.key(a, wa) < Policy::Fcfs.key(b, wb));
        assert!(Policy::Priority.key(b, wb) < Policy::Priority.key(a, wa));
        // b arrived 1 s later with 7 s less work: it finishes sooner.
        assert!(Policy::Shortest.key(b, wb) < Policy::Shortest.key(a, wa));
        // Once a has been computed past the difference, it goes first.
        assert!(Policy::Shortest.key(a, 2_500_000) < Policy::Shortest.key(b, wb));
    }
}
