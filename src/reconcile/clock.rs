//! The agent's clock: wall-clock time that keeps step with the monotonic clock while a
//! deadline waits.
//!
//! The core keeps deadlines as wall-clock instants (they must survive a restart, and results
//! carry wall-clock times), so a wall clock that jumps would move them: backwards, and a
//! deadline is held for as long as the jump (forever, for a clock reset to 1970); forwards, and
//! it fires early. This clock reads the wall clock once (its anchor) and from there advances
//! with `CLOCK_BOOTTIME`, which nothing sets and which counts a suspend. So in one process no
//! jump moves a deadline: it fires after its budget, measured. It follows the wall clock again
//! only when nothing waits on time ([`SteadyClock::follow_wall`]: the owner asks at rest), so
//! published times track a corrected clock. A new process anchors at the wall clock, but never
//! before the store's newest entry ([`SteadyClock::system`]'s `floor`): time does not go back
//! behind what the node already recorded, so a clock set back while the agent was down
//! (a bad RTC after a power cut) holds a deadline at most for the time since that entry, never
//! for the size of the jump.

use crate::exec::Clock;
use crate::lifecycle::Timestamp;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A wall-clock difference worth a log line: NTP slews by far less.
const JUMP: i64 = 2_000;

type Wall = Arc<dyn Fn() -> Timestamp + Send + Sync>;
type Mono = Arc<dyn Fn() -> Duration + Send + Sync>;

#[derive(Clone)]
pub struct SteadyClock {
    wall: Wall,
    mono: Mono,
    anchor: Arc<Mutex<Anchor>>,
}

#[derive(Clone, Copy, Debug)]
struct Anchor {
    wall: Timestamp,
    mono: Duration,
    /// The jump since the anchor was already logged.
    told: bool,
}

impl std::fmt::Debug for SteadyClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SteadyClock")
            .field("anchor", &*self.lock())
            .finish()
    }
}

/// `CLOCK_BOOTTIME`: monotonic, counts a suspend, unaffected by setting the time.
pub fn boottime() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

impl SteadyClock {
    /// The system's clocks, anchored now, not before `floor` (the store's newest entry).
    pub fn system(floor: Option<Timestamp>) -> Self {
        Self::with_sources(
            Arc::new(|| crate::exec::SystemClock.now()),
            Arc::new(boottime),
            floor,
        )
    }

    /// Any wall clock and monotonic clock (tests move the wall clock).
    pub fn with_sources(wall: Wall, mono: Mono, floor: Option<Timestamp>) -> Self {
        let at = wall();
        let anchor = Anchor {
            wall: floor.map_or(at, |f| at.max(f)),
            mono: mono(),
            told: false,
        };
        Self {
            wall,
            mono,
            anchor: Arc::new(Mutex::new(anchor)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Anchor> {
        self.anchor.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Nothing waits on time: take the wall clock as it is now.
    pub fn follow_wall(&self) {
        let (wall, mono) = ((self.wall)(), (self.mono)());
        *self.lock() = Anchor {
            wall,
            mono,
            told: false,
        };
    }

    /// How far the wall clock is from this clock in milliseconds (positive: ahead), the
    /// first time it is more than a slew since the anchor; `None` otherwise.
    pub fn jumped(&self) -> Option<i64> {
        let drift = (self.wall)().millis() - self.now().millis();
        let mut anchor = self.lock();
        if drift.abs() <= JUMP || anchor.told {
            return None;
        }
        anchor.told = true;
        Some(drift)
    }
}

impl Clock for SteadyClock {
    fn now(&self) -> Timestamp {
        let anchor = *self.lock();
        let since = (self.mono)().saturating_sub(anchor.mono);
        Timestamp::from_millis(
            anchor
                .wall
                .millis()
                .saturating_add(i64::try_from(since.as_millis()).unwrap_or(i64::MAX)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicI64, Ordering};

    /// A wall clock and a monotonic clock the test moves.
    fn clocks(wall: i64) -> (Arc<AtomicI64>, Arc<AtomicI64>, Wall, Mono) {
        let w = Arc::new(AtomicI64::new(wall));
        let m = Arc::new(AtomicI64::new(1_000));
        let (w2, m2) = (w.clone(), m.clone());
        (
            w,
            m,
            Arc::new(move || Timestamp::from_millis(w2.load(Ordering::SeqCst))),
            Arc::new(move || Duration::from_millis(m2.load(Ordering::SeqCst) as u64)),
        )
    }

    #[test]
    fn a_wall_clock_jump_does_not_move_it_while_anchored() {
        let (w, m, wall, mono) = clocks(1_000_000);
        let clock = SteadyClock::with_sources(wall, mono, None);
        let deadline = clock.now().plus_secs(300);
        // 100 s pass; the wall clock is set back an hour, then forward two.
        m.fetch_add(100_000, Ordering::SeqCst);
        w.fetch_add(100_000 - 3_600_000, Ordering::SeqCst);
        assert_eq!(clock.now().millis(), 1_100_000);
        assert_eq!(clock.jumped(), Some(-3_600_000));
        assert_eq!(clock.jumped(), None, "told once");
        w.fetch_add(7_200_000, Ordering::SeqCst);
        assert!(clock.now() < deadline, "not early");
        m.fetch_add(200_000, Ordering::SeqCst);
        assert_eq!(clock.now(), deadline, "due after 300 s measured");
    }

    #[test]
    fn at_rest_it_follows_the_wall_clock() {
        let (w, m, wall, mono) = clocks(1_000_000);
        let clock = SteadyClock::with_sources(wall, mono, None);
        w.fetch_sub(500_000, Ordering::SeqCst);
        m.fetch_add(1_000, Ordering::SeqCst);
        clock.follow_wall();
        assert_eq!(clock.now().millis(), 500_000);
        assert_eq!(clock.jumped(), None);
    }

    #[test]
    fn a_new_process_never_starts_before_the_store_s_newest_entry() {
        let (_w, _m, wall, mono) = clocks(0); // an RTC back at 1970
        let floor = Timestamp::from_millis(1_785_578_400_000);
        let clock = SteadyClock::with_sources(wall, mono, Some(floor));
        assert_eq!(clock.now(), floor);
        let (_w, _m, wall, mono) = clocks(1_785_578_500_000);
        let clock = SteadyClock::with_sources(wall, mono, Some(floor));
        assert_eq!(
            clock.now().millis(),
            1_785_578_500_000,
            "a later wall clock wins"
        );
    }

    #[test]
    fn boottime_advances() {
        let a = boottime();
        std::thread::sleep(Duration::from_millis(5));
        assert!(boottime() > a);
    }
}
