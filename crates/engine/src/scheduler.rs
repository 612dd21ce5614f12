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
}

/// What the policy sees of a request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rank {
    /// Submission order.
    pub arrival: u64,
    /// The request's priority value.
    pub priority: i32,
}

impl Policy {
    /// Sort key: smaller runs first.
    pub(crate) fn key(self, r: Rank) -> (i64, u64) {
        match self {
            Policy::Fcfs => (0, r.arrival),
            Policy::Priority => (i64::from(r.priority), r.arrival),
        }
    }

    /// Parses `fcfs` or `priority`.
    pub fn parse(s: &str) -> Option<Policy> {
        match s {
            "fcfs" => Some(Policy::Fcfs),
            "priority" => Some(Policy::Priority),
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
        };
        let b = Rank {
            arrival: 2,
            priority: -1,
        };
        assert!(Policy::Fcfs.key(a) < Policy::Fcfs.key(b));
        assert!(Policy::Priority.key(b) < Policy::Priority.key(a));
    }
}
