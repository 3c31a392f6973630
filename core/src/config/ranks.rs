//! Sets of ranks as written in a config: `"0-3"`, `"5"`, `"0-3,8-11"`, or every rank.

use std::fmt;
use std::ops::RangeInclusive;
use std::str::FromStr;

use serde::de::{self, Deserialize, Deserializer, Visitor};

/// A set of ranks: inclusive ranges, kept sorted and merged, or every rank.
///
/// Parses from `"a-b"` (inclusive), `"n"`, comma lists of those (`"0-3, 8-11"`) and `"all"`;
/// displays in the same syntax, normalized (`"0-3,4"` displays as `"0-4"`).
///
/// ```
/// use ferrocx::config::RankSet;
/// let ranks: RankSet = "0-3,8".parse().unwrap();
/// assert!(ranks.contains(2) && ranks.contains(8) && !ranks.contains(5));
/// assert_eq!(ranks.to_string(), "0-3,8");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RankSet {
    repr: Repr,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Repr {
    All,
    /// Sorted by start, disjoint and not adjacent.
    Ranges(Vec<RangeInclusive<usize>>),
}

/// Why a rank list did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParseRankSetError(String);

impl RankSet {
    /// Every rank, whatever the world size.
    pub fn all() -> Self {
        RankSet { repr: Repr::All }
    }

    /// The ranks covered by `ranges` (in any order, overlaps allowed; empty ranges ignored).
    pub fn from_ranges(ranges: impl IntoIterator<Item = RangeInclusive<usize>>) -> Self {
        let mut sorted: Vec<_> = ranges.into_iter().filter(|r| !r.is_empty()).collect();
        sorted.sort_by_key(|r| *r.start());
        let mut merged: Vec<RangeInclusive<usize>> = Vec::with_capacity(sorted.len());
        for r in sorted {
            match merged.last_mut() {
                // Overlapping or adjacent: extend the previous range.
                Some(last) if *r.start() <= last.end().saturating_add(1) => {
                    let end = (*last.end()).max(*r.end());
                    *last = *last.start()..=end;
                }
                _ => merged.push(r),
            }
        }
        RankSet {
            repr: Repr::Ranges(merged),
        }
    }

    /// Parses a rank list; see the type's documentation for the syntax.
    pub fn parse(text: &str) -> Result<Self, ParseRankSetError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(ParseRankSetError(
                "empty rank list: write e.g. \"0-3\", \"5\" or \"0-3,8-11\"".into(),
            ));
        }
        if text.eq_ignore_ascii_case("all") {
            return Ok(Self::all());
        }
        let mut ranges = Vec::new();
        for item in text.split(',') {
            let item = item.trim();
            if item.is_empty() {
                return Err(ParseRankSetError(format!(
                    "empty entry in rank list \"{text}\" (a stray comma?)"
                )));
            }
            let range = match item.split_once('-') {
                Some((start, end)) => {
                    let (start, end) = (rank_number(start, item)?, rank_number(end, item)?);
                    if start > end {
                        return Err(ParseRankSetError(format!(
                            "rank range \"{item}\" is reversed: its start {start} is greater than its end {end}"
                        )));
                    }
                    start..=end
                }
                None => {
                    let rank = rank_number(item, item)?;
                    rank..=rank
                }
            };
            ranges.push(range);
        }
        Ok(Self::from_ranges(ranges))
    }

    /// Whether this is the set of every rank.
    pub fn is_all(&self) -> bool {
        matches!(self.repr, Repr::All)
    }

    /// Whether no rank is in the set.
    pub fn is_empty(&self) -> bool {
        matches!(&self.repr, Repr::Ranges(r) if r.is_empty())
    }

    /// Whether `rank` is in the set.
    pub fn contains(&self, rank: usize) -> bool {
        match &self.repr {
            Repr::All => true,
            Repr::Ranges(ranges) => {
                // Ranges are sorted and disjoint: the candidate is the last one starting at or
                // before `rank`.
                let i = ranges.partition_point(|r| *r.start() <= rank);
                i > 0 && ranges[i - 1].contains(&rank)
            }
        }
    }

    /// The sorted, merged ranges; `None` for the set of every rank.
    pub fn ranges(&self) -> Option<&[RangeInclusive<usize>]> {
        match &self.repr {
            Repr::All => None,
            Repr::Ranges(ranges) => Some(ranges),
        }
    }

    /// How many ranks are in the set; `None` for the set of every rank.
    pub fn len(&self) -> Option<usize> {
        self.ranges()
            .map(|rs| rs.iter().map(|r| r.end() - r.start() + 1).sum())
    }

    /// The ranks in both sets.
    pub fn intersection(&self, other: &RankSet) -> RankSet {
        let (a, b) = match (&self.repr, &other.repr) {
            (Repr::All, _) => return other.clone(),
            (_, Repr::All) => return self.clone(),
            (Repr::Ranges(a), Repr::Ranges(b)) => (a, b),
        };
        let (mut i, mut j, mut out) = (0, 0, Vec::new());
        while i < a.len() && j < b.len() {
            let start = (*a[i].start()).max(*b[j].start());
            let end = (*a[i].end()).min(*b[j].end());
            if start <= end {
                out.push(start..=end);
            }
            // Drop whichever range ends first: it cannot meet anything further on the other side.
            if a[i].end() < b[j].end() {
                i += 1;
            } else {
                j += 1;
            }
        }
        RankSet {
            repr: Repr::Ranges(out),
        }
    }

    /// Whether the two sets share a rank.
    pub fn overlaps(&self, other: &RankSet) -> bool {
        !self.intersection(other).is_empty()
    }
}

/// Parses one rank number of `item`, naming `item` in the error.
fn rank_number(text: &str, item: &str) -> Result<usize, ParseRankSetError> {
    let text = text.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ParseRankSetError(format!(
            "\"{item}\" is neither a rank number nor a range \"a-b\""
        )));
    }
    text.parse()
        .map_err(|_| ParseRankSetError(format!("rank {text} in \"{item}\" is too large")))
}

impl FromStr for RankSet {
    type Err = ParseRankSetError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for RankSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ranges = match &self.repr {
            Repr::All => return f.write_str("all"),
            Repr::Ranges(ranges) => ranges,
        };
        for (i, r) in ranges.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if r.start() == r.end() {
                write!(f, "{}", r.start())?;
            } else {
                write!(f, "{}-{}", r.start(), r.end())?;
            }
        }
        Ok(())
    }
}

/// A rank list string, or a single rank as a TOML integer (`ranks = 3`).
impl<'de> Deserialize<'de> for RankSet {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct RankSetVisitor;

        impl Visitor<'_> for RankSetVisitor {
            type Value = RankSet;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a rank list such as \"0-3,8\" or a rank number")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<RankSet, E> {
                RankSet::parse(v).map_err(E::custom)
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RankSet, E> {
                let rank =
                    usize::try_from(v).map_err(|_| E::custom(format!("rank {v} is too large")))?;
                Ok(RankSet::from_ranges([rank..=rank]))
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RankSet, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) => Err(E::custom(format!("rank {v} is negative"))),
                }
            }
        }

        deserializer.deserialize_any(RankSetVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> RankSet {
        match RankSet::parse(s) {
            Ok(r) => r,
            Err(e) => panic!("{s:?} should parse: {e}"),
        }
    }

    #[test]
    fn parses_ranges_singles_and_lists() {
        assert_eq!(parse("0-3").ranges(), Some(&[0..=3][..]));
        assert_eq!(parse("5").ranges(), Some(&[5..=5][..]));
        assert_eq!(parse(" 8-11 , 0-3 ").ranges(), Some(&[0..=3, 8..=11][..]));
        assert_eq!(parse("3-3").len(), Some(1));
        assert!(parse("all").is_all());
        assert!(parse("ALL").contains(usize::MAX));
    }

    #[test]
    fn merges_and_displays_normalized() {
        assert_eq!(parse("0-3,4,6-7,5").to_string(), "0-7");
        assert_eq!(parse("8,0-3,2-5").to_string(), "0-5,8");
        assert_eq!(parse("0-3,8-11").to_string(), "0-3,8-11");
        assert_eq!(parse("7").to_string(), "7");
        assert_eq!(RankSet::all().to_string(), "all");
        // Display round-trips.
        for s in ["0-3,8", "1", "0-3,5-9,12", "all"] {
            assert_eq!(parse(&parse(s).to_string()), parse(s));
        }
    }

    #[test]
    fn rejects_malformed_lists() {
        for bad in [
            "", " ", "3-1", "a", "1-", "-1", "0-3,", ",0", "0--3", "1.5", "+1", "0-3;4",
        ] {
            assert!(RankSet::parse(bad).is_err(), "{bad:?} should not parse");
        }
        let e = RankSet::parse("3-1")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("reversed"), "{e}");
        let e = RankSet::parse("99999999999999999999999")
            .err()
            .map(|e| e.to_string());
        assert!(e.unwrap_or_default().contains("too large"));
    }

    #[test]
    fn contains_checks_every_range() {
        let r = parse("0-3,8-11,20");
        let members: Vec<usize> = (0..25).filter(|&i| r.contains(i)).collect();
        assert_eq!(members, [0, 1, 2, 3, 8, 9, 10, 11, 20]);
        assert_eq!(r.len(), Some(9));
    }

    #[test]
    fn intersection_and_overlap() {
        let a = parse("0-3,8-11");
        let b = parse("2-9");
        assert_eq!(a.intersection(&b).to_string(), "2-3,8-9");
        assert_eq!(b.intersection(&a), a.intersection(&b));
        assert!(a.overlaps(&b));
        assert!(!parse("0-3").overlaps(&parse("4-7")));
        assert!(!parse("0,2,4").overlaps(&parse("1,3,5")));
        assert_eq!(RankSet::all().intersection(&a), a);
        assert!(RankSet::all().overlaps(&parse("100")));
        assert!(!RankSet::all().overlaps(&RankSet::from_ranges([])));
        assert!(RankSet::from_ranges([]).is_empty());
    }
}
