//! The fixed part layout of an object: which byte range multipart part `k` covers.
//!
//! Part `k` (1-based) covers a range that depends only on `k`, never on the object's final
//! size, so a part can be uploaded before the file's size is known and never moves. Parts
//! 1..=1000 are `part_size` bytes each; every later group of 1000 parts doubles the size
//! (16 MiB for parts 1001..=2000 with the default 8 MiB, ...), capped at S3's largest part
//! (5 GiB). With 8 MiB parts the 10,000 parts reach past S3's largest object (5 TiB), and
//! every part but the one holding the end of the file is at least `part_size` (at least
//! 5 MiB, S3's smallest non-last part), so any size the file ends at is a valid upload.
//!
//! This is pure arithmetic. The backend declares it to the core as its *write granule*
//! ([`PartLayout::granule`]: `write_granule_bytes` and `write_granule_group`), so the flusher
//! writes each part whole, in one write, once.

use std::io;
use std::ops::Range;

/// S3's smallest part, except the last.
pub const PART_BYTES_MIN: u64 = 5 << 20;
/// S3's largest part.
pub const PART_BYTES_MAX: u64 = 5 << 30;
/// S3's largest part number.
pub const PARTS_MAX: u32 = 10_000;
/// S3's largest object.
pub const OBJECT_BYTES_MAX: u64 = 5 << 40;
/// Parts per group of equal size.
const GROUP_PARTS: u32 = 1000;
/// Groups in the layout.
const GROUPS: u32 = PARTS_MAX / GROUP_PARTS;

/// Where each part of an object lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartLayout {
    part_size: u64,
}

impl PartLayout {
    /// The default layout: 8 MiB parts (the AWS CLI's size), about 8 TiB in 10,000 parts.
    pub const DEFAULT_PART_BYTES: u64 = 8 << 20;

    /// A layout whose first 1000 parts are `part_size` bytes: at least 5 MiB, at most 5 GiB,
    /// a multiple of 4 KiB (so a part is whole pages); `InvalidInput` naming the rule otherwise.
    pub fn new(part_size: u64) -> io::Result<PartLayout> {
        if !(PART_BYTES_MIN..=PART_BYTES_MAX).contains(&part_size)
            || !part_size.is_multiple_of(4096)
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "S3 part size {part_size} bytes: must be a multiple of 4 KiB between 5 MiB \
                     and 5 GiB"
                ),
            ));
        }
        Ok(PartLayout { part_size })
    }

    /// The size of parts 1..=1000.
    pub fn part_size(&self) -> u64 {
        self.part_size
    }

    /// The size of each part of group `group` (0-based).
    fn group_part_bytes(&self, group: u32) -> u64 {
        self.part_size.saturating_mul(1 << group).min(PART_BYTES_MAX)
    }

    /// The byte range part `part` covers. `part` must be in 1..=10,000.
    pub fn range(&self, part: u32) -> Range<u64> {
        assert!((1..=PARTS_MAX).contains(&part), "part number {part} outside 1..=10000");
        let group = (part - 1) / GROUP_PARTS;
        let start_of_group: u64 =
            (0..group).map(|g| self.group_part_bytes(g) * u64::from(GROUP_PARTS)).sum();
        let bytes = self.group_part_bytes(group);
        let start = start_of_group + u64::from((part - 1) % GROUP_PARTS) * bytes;
        start..start + bytes
    }

    /// The part holding byte `offset`, or `None` past the layout's last part.
    pub fn part_of(&self, offset: u64) -> Option<u32> {
        let mut start = 0u64;
        for group in 0..GROUPS {
            let bytes = self.group_part_bytes(group);
            let end = start + bytes * u64::from(GROUP_PARTS);
            if offset < end {
                return Some(group * GROUP_PARTS + ((offset - start) / bytes) as u32 + 1);
            }
            start = end;
        }
        None
    }

    /// The largest object this layout can hold: the end of part 10,000, at most 5 TiB.
    pub fn size_max(&self) -> u64 {
        self.range(PARTS_MAX).end.min(OBJECT_BYTES_MAX)
    }

    /// The core's write granule for this layout, `(write_granule_bytes,
    /// write_granule_group)`: parts of `part_size` doubling every 1000. `None` for a layout
    /// whose parts reach S3's 5 GiB cap below its largest object (parts of 2.5 GiB and more),
    /// which a doubling granule cannot describe.
    pub fn granule(&self) -> Option<(u64, u32)> {
        let mut start = 0u64;
        for group in 0..GROUPS {
            if start >= self.size_max() {
                break;
            }
            if self.group_part_bytes(group) != self.part_size << group {
                return None;
            }
            start += self.group_part_bytes(group) * u64::from(GROUP_PARTS);
        }
        Some((self.part_size, GROUP_PARTS))
    }

    /// How many parts an object of `size` bytes has (0 for an empty one). `size` must be at
    /// most [`PartLayout::size_max`].
    pub fn part_count(&self, size: u64) -> u32 {
        if size == 0 {
            return 0;
        }
        self.part_of(size - 1).expect("size beyond the layout")
    }

    /// The bytes of part `part` inside an object of `size` bytes: the part's range cut at
    /// `size` (empty past it).
    pub fn extent(&self, part: u32, size: u64) -> Range<u64> {
        let range = self.range(part);
        range.start.min(size)..range.end.min(size)
    }
}

impl Default for PartLayout {
    fn default() -> PartLayout {
        PartLayout { part_size: PartLayout::DEFAULT_PART_BYTES }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn first_group_has_equal_parts() {
        let layout = PartLayout::default();
        assert_eq!(layout.range(1), 0..8 * MIB);
        assert_eq!(layout.range(2), 8 * MIB..16 * MIB);
        assert_eq!(layout.range(1000), 999 * 8 * MIB..1000 * 8 * MIB);
        assert_eq!(layout.part_of(0), Some(1));
        assert_eq!(layout.part_of(8 * MIB - 1), Some(1));
        assert_eq!(layout.part_of(8 * MIB), Some(2));
    }

    /// The core's granules are the parts, for every byte an object can hold.
    #[test]
    fn the_core_granule_is_the_part() {
        for part_size in [5 * MIB, 8 * MIB, 64 * MIB, 1 << 30, 2 << 30] {
            let layout = PartLayout::new(part_size).unwrap();
            let (bytes, group) = layout.granule().expect("a doubling layout");
            let mut backend = ebb_core::BackendConfig::new("s3");
            backend.write_granule_bytes = Some(bytes);
            backend.write_granule_group = group;
            let page = ebb_core::PAGE_SIZE;
            for part in (1..=PARTS_MAX).step_by(97).chain([999, 1000, 1001, 9999, PARTS_MAX]) {
                let range = layout.range(part);
                if range.start >= layout.size_max() {
                    continue;
                }
                for offset in [range.start, range.end - 1] {
                    let pages = backend.granule_of(offset / page).unwrap();
                    assert_eq!(pages.start * page..pages.end * page, range, "part {part}");
                }
            }
        }
        assert_eq!(PartLayout::new(3 << 30).unwrap().granule(), None, "capped at 5 GiB");
    }

    #[test]
    fn later_groups_double() {
        let layout = PartLayout::default();
        let group_one_start = 1000 * 8 * MIB;
        assert_eq!(layout.range(1001), group_one_start..group_one_start + 16 * MIB);
        assert_eq!(layout.part_of(group_one_start), Some(1001));
        assert_eq!(layout.part_of(group_one_start + 16 * MIB), Some(1002));
        let group_two_start = group_one_start + 1000 * 16 * MIB;
        assert_eq!(layout.range(2001).start, group_two_start);
        assert_eq!(layout.range(2001).end - group_two_start, 32 * MIB);
    }

    #[test]
    fn ranges_tile_the_layout_and_part_of_inverts_range() {
        for part_size in [5 * MIB, 8 * MIB, 64 * MIB, 5 << 30] {
            let layout = PartLayout::new(part_size).unwrap();
            let mut expected_start = 0;
            for part in 1..=PARTS_MAX {
                let range = layout.range(part);
                assert_eq!(range.start, expected_start, "part {part} of {part_size}");
                assert!(PART_BYTES_MIN <= range.end - range.start);
                assert!(range.end - range.start <= PART_BYTES_MAX);
                assert_eq!(layout.part_of(range.start), Some(part));
                assert_eq!(layout.part_of(range.end - 1), Some(part));
                expected_start = range.end;
            }
            assert_eq!(layout.part_of(expected_start), None);
        }
    }

    #[test]
    fn the_default_layout_reaches_the_s3_object_limit() {
        let layout = PartLayout::default();
        assert_eq!(layout.size_max(), OBJECT_BYTES_MAX);
        assert!(layout.part_count(OBJECT_BYTES_MAX) <= PARTS_MAX);
        // The smallest part size cannot: the layout says how far it goes.
        let small = PartLayout::new(5 * MIB).unwrap();
        assert!(small.size_max() < OBJECT_BYTES_MAX);
        assert_eq!(small.part_count(small.size_max()), PARTS_MAX);
    }

    #[test]
    fn part_count_and_extent_follow_the_size() {
        let layout = PartLayout::default();
        assert_eq!(layout.part_count(0), 0);
        assert_eq!(layout.part_count(1), 1);
        assert_eq!(layout.part_count(8 * MIB), 1);
        assert_eq!(layout.part_count(8 * MIB + 1), 2);
        assert_eq!(layout.extent(2, 8 * MIB + 100), 8 * MIB..8 * MIB + 100);
        assert_eq!(layout.extent(1, 8 * MIB + 100), 0..8 * MIB);
        assert!(layout.extent(3, 8 * MIB + 100).is_empty());
    }

    #[test]
    fn bad_part_sizes_are_refused_with_the_rule() {
        for bad in [0, 4 * MIB, 5 * MIB + 1, (5 << 30) + 4096] {
            let error = PartLayout::new(bad).unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
            assert!(error.to_string().contains("5 MiB"), "{error}");
        }
    }
}
