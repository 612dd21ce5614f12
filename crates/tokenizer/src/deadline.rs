//! A wall-clock limit on one chat-template render.
//!
//! minijinja's fuel counts instructions, not what each costs: one `join` over
//! a 100,000-item `range()` is a single step, so a template within its fuel
//! can still keep a core busy for minutes (measured in `docs/reliability.md`).
//! minijinja has no hook per instruction, so the clock is read where long work
//! shows itself: every item of a `range()` (the loops a template makes up on
//! its own; its other loops walk the request's bounded messages and tools) and
//! every write of output. Past the deadline a range stops yielding and a write
//! fails; the render is then reported as over time, whatever it returned.

use std::cell::Cell;
use std::time::{Duration, Instant};

use minijinja::value::ValueIter;
use minijinja::{Error, Value};

/// Longest one render may run. Real templates render a long conversation in
/// milliseconds; this only stops a template doing something else.
pub const TEMPLATE_DEADLINE: Duration = Duration::from_secs(5);

thread_local! {
    /// When the render on this thread must stop, if one is running.
    static DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
    /// Whether that render saw its deadline pass.
    static LATE: Cell<bool> = const { Cell::new(false) };
}

/// Runs one render under [`TEMPLATE_DEADLINE`]; `Err(r)` when the deadline
/// passed (`r` being what the render returned, unusable).
pub(crate) fn within_deadline<T>(render: impl FnOnce() -> T) -> Result<T, T> {
    let outer = DEADLINE.replace(Some(Instant::now() + TEMPLATE_DEADLINE));
    let outer_late = LATE.replace(false);
    let r = render();
    let late = LATE.replace(outer_late);
    DEADLINE.set(outer);
    if late {
        Err(r)
    } else {
        Ok(r)
    }
}

/// Whether the running render is past its deadline (and so marked late).
pub(crate) fn past_deadline() -> bool {
    let past = DEADLINE.get().is_some_and(|d| Instant::now() >= d);
    if past {
        LATE.set(true);
    }
    past
}

/// minijinja's `range()` (same arguments, limits and errors) whose items stop
/// coming once the render is past its deadline.
pub(crate) fn range(
    lower: isize,
    upper: Option<isize>,
    step: Option<isize>,
) -> Result<Value, Error> {
    let items = minijinja::functions::range(lower, upper, step)?;
    // A range value always iterates; an empty one stands in should it not.
    Ok(Value::make_iterable(move || Timed(items.try_iter().ok())))
}

/// A range's items until the deadline.
struct Timed(Option<ValueIter>);

impl Iterator for Timed {
    type Item = Value;

    fn next(&mut self) -> Option<Value> {
        if past_deadline() {
            return None;
        }
        self.0.as_mut()?.next()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.0.as_ref().map_or((0, Some(0)), |i| i.size_hint())
    }
}
