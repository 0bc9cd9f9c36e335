//! Time as the state machines see it: an input, never read from a clock.
//!
//! The machines ([`crate::retry::Retry`], [`crate::batch::Batcher`]) are generic over the
//! instant type so every host passes its own clock's readings: the Rust host
//! `std::time::Instant`, hosts across WIT milliseconds on their monotonic clock
//! ([`Millis`]), tests any simulated instants.

use std::fmt::Debug;
use std::ops::Add;
use std::time::Duration;

/// An instant on some monotonic clock: ordered, and moved forward by a [`Duration`].
pub trait Time: Copy + Ord + Debug + Add<Duration, Output = Self> {}

impl<T: Copy + Ord + Debug + Add<Duration, Output = T>> Time for T {}

/// Milliseconds on a host's monotonic clock (any origin, the same for a machine's life):
/// the instants that cross WIT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Millis(pub u64);

impl Add<Duration> for Millis {
    type Output = Millis;

    /// Rounds a fraction of a millisecond up, so a deadline is never earlier than the
    /// duration asks; saturates instead of wrapping.
    fn add(self, d: Duration) -> Millis {
        let ms = d.as_nanos().div_ceil(1_000_000);
        Millis(self.0.saturating_add(u64::try_from(ms).unwrap_or(u64::MAX)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_round_fractions_up_and_saturate() {
        assert_eq!(Millis(5) + Duration::from_millis(3), Millis(8));
        assert_eq!(Millis(5) + Duration::from_micros(1), Millis(6));
        assert_eq!(
            Millis(u64::MAX - 1) + Duration::from_secs(1),
            Millis(u64::MAX)
        );
        assert_eq!(Millis(0) + Duration::MAX, Millis(u64::MAX));
    }
}
