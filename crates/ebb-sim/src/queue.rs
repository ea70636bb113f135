//! The simulator's event queue: a min-heap of events keyed by (time, insertion sequence).
//!
//! Every discrete-event loop needs a rule for events scheduled at the same instant; if the
//! order were left to the heap's internals, a harmless change (one more event pushed earlier)
//! could reorder unrelated same-time events and make two runs with the same seed diverge.
//!
//! # Ordering contract
//!
//! [`EventQueue::pop`] returns the event with the smallest time; among events with equal
//! times it returns them in the order they were pushed (first in, first out). The tie-break
//! is a `u64` sequence number assigned by [`EventQueue::push`], so the order is total and
//! independent of the payload type, which therefore needs no `Ord` implementation.
//!
//! The queue itself does not require pushes to be monotonic in time: pushing an event
//! earlier than one already popped is allowed, and the driver loop decides whether that is
//! an error.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use ebb_core::time::Instant;

/// A priority queue of events ordered by (time, insertion order); see the module doc.
#[derive(Debug, Clone)]
pub struct EventQueue<E> {
    heap: BinaryHeap<Entry<E>>,
    sequence_next: u64,
}

/// One queued event; ordered so that the std max-heap pops the earliest (time, sequence).
///
/// Time and sequence are packed into one `u128` (time in the high half), so that ordering
/// is a single integer comparison in the heap's inner loop.
#[derive(Debug, Clone)]
struct Entry<E> {
    key: u128,
    event: E,
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

impl<E> Eq for Entry<E> {}

impl<E> Entry<E> {
    fn time(key: u128) -> Instant {
        Instant::from_nanos((key >> 64) as u64)
    }
}

impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<E> Ord for Entry<E> {
    fn cmp(&self, other: &Self) -> Ordering {
        // Reversed so that BinaryHeap, a max-heap, yields the smallest key first.
        other.key.cmp(&self.key)
    }
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        EventQueue::new()
    }
}

impl<E> EventQueue<E> {
    /// An empty queue.
    pub fn new() -> EventQueue<E> {
        EventQueue { heap: BinaryHeap::new(), sequence_next: 0 }
    }

    /// An empty queue with room for `capacity` events before it reallocates.
    pub fn with_capacity(capacity: usize) -> EventQueue<E> {
        EventQueue { heap: BinaryHeap::with_capacity(capacity), sequence_next: 0 }
    }

    /// Schedules `event` at `at`; among equal times it pops after everything pushed before.
    #[inline]
    pub fn push(&mut self, at: Instant, event: E) {
        let sequence = self.sequence_next;
        self.sequence_next += 1;
        let key = (u128::from(at.as_nanos()) << 64) | u128::from(sequence);
        self.heap.push(Entry { key, event });
    }

    /// Removes and returns the earliest event (FIFO among equal times).
    #[inline]
    pub fn pop(&mut self) -> Option<(Instant, E)> {
        self.heap.pop().map(|entry| (Entry::<E>::time(entry.key), entry.event))
    }

    /// The time of the event [`EventQueue::pop`] would return next.
    #[inline]
    pub fn peek_time(&self) -> Option<Instant> {
        self.heap.peek().map(|entry| Entry::<E>::time(entry.key))
    }

    /// Number of queued events.
    #[inline]
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// True when no event is queued.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prng::Prng;

    #[test]
    fn pops_in_time_order() {
        // Goal: events come out sorted by time regardless of push order.
        let mut queue = EventQueue::new();
        for (time, label) in [(30, "c"), (10, "a"), (20, "b")] {
            queue.push(Instant::from_nanos(time), label);
        }
        assert_eq!(queue.len(), 3);
        assert_eq!(queue.peek_time(), Some(Instant::from_nanos(10)));
        assert_eq!(queue.pop(), Some((Instant::from_nanos(10), "a")));
        assert_eq!(queue.pop(), Some((Instant::from_nanos(20), "b")));
        assert_eq!(queue.pop(), Some((Instant::from_nanos(30), "c")));
        assert_eq!(queue.pop(), None);
        assert!(queue.is_empty());
        assert_eq!(queue.peek_time(), None);
    }

    #[test]
    fn equal_times_pop_in_insertion_order() {
        // Goal: the documented tie-break holds under a random mix of times, checked against a
        // stable sort of (time, push index).
        let mut prng = Prng::new(3);
        let mut queue = EventQueue::new();
        let mut expected = Vec::new();
        for index in 0..10_000u64 {
            let time = prng.below(50);
            queue.push(Instant::from_nanos(time), index);
            expected.push((time, index));
        }
        expected.sort();
        let popped: Vec<(u64, u64)> =
            std::iter::from_fn(|| queue.pop()).map(|(at, index)| (at.as_nanos(), index)).collect();
        assert_eq!(popped, expected);
    }

    #[test]
    fn interleaved_push_pop_keeps_fifo_ties() {
        // Goal: an event pushed at the current time after some pops still goes behind the
        // same-time events already queued, as the driver loop relies on.
        let mut queue = EventQueue::new();
        let now = Instant::from_nanos(5);
        queue.push(now, 1);
        queue.push(now, 2);
        assert_eq!(queue.pop(), Some((now, 1)));
        queue.push(now, 3);
        queue.push(Instant::from_nanos(4), 0);
        assert_eq!(queue.pop(), Some((Instant::from_nanos(4), 0)));
        assert_eq!(queue.pop(), Some((now, 2)));
        assert_eq!(queue.pop(), Some((now, 3)));
    }
}
