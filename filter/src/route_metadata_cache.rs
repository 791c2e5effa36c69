//! A worker's copy of its routes' overrides (the bytes of the property
//! `xds.route_metadata.filter_metadata.adaptive_hedge`), so that a request
//! on a known route does not read the property again.
//!
//! Why: every property read is a host call, several thousand instructions
//! of Envoy's CPU, and the overrides change only with the route
//! configuration (xDS), while the route's name is read anyway. An entry is
//! trusted for the ticks of a second (`fresh_ticks`; one tick if a tick is
//! longer) and then read again, so a route whose metadata changes is
//! followed within about a second (until 2026-11-29 five ticks, whatever
//! their length: 50 s at a `sync_interval` of 10 s, for a route just
//! turned off). Keyed by cluster and route name: an unnamed route is not
//! cached (its metadata is read on each request, as before).
//!
//! Envoy does not make route names unique: two virtual hosts (or two
//! listeners served by one plugin) may each have a route `default` to one
//! cluster, with different overrides. Cached under one key, one route's
//! overrides served the other's requests for a second at a time (a route
//! with `disabled: true` was armed). A name whose overrides go back to
//! what they were before the last change within a minute of it, twice
//! running (A, B, A, B: the two routes' requests take turns at the reads;
//! an xDS rollback is one going back, and comes later as a rule), is taken
//! for such a name: `ambiguous`, read on every request, and the caller
//! treats the route as unnamed. Ten minutes of one metadata, and it is a
//! name again.
//!
//! Plain Rust: the caller reads the property and says which tick it is.

/// How long an entry is trusted before the property is read again (µs).
const FRESH_FOR_US: u64 = 1_000_000;

/// The ticks of `tick_us` an entry is trusted: those of a second, at
/// least one.
pub fn fresh_ticks(tick_us: u64) -> u64 {
    FRESH_FOR_US.div_ceil(tick_us.max(1)).max(1)
}
/// A name whose overrides go back within this many seconds (of ticks:
/// `fresh_ticks` a second), `FLIP_BACKS` times running, is ambiguous; a
/// name again after `UNAMBIGUOUS_AFTER_SECONDS` without going back.
const FLIP_BACK_SECONDS: u64 = 60;
const FLIP_BACKS: u32 = 2;
const UNAMBIGUOUS_AFTER_SECONDS: u64 = 600;
/// Routes a worker remembers; past it the stalest entry makes room.
pub const MAX_ROUTES: usize = 64;

#[derive(Debug)]
pub struct RouteMetadataCache {
    entries: Vec<Entry>,
    fresh_ticks: u64,
}

#[derive(Debug)]
struct Entry {
    cluster: Box<[u8]>,
    route: Box<[u8]>,
    metadata: Box<[u8]>,
    /// What the metadata was before its last change, and that change's
    /// tick.
    previous: Option<Box<[u8]>>,
    changed_at_tick: u64,
    /// Changes back to the previous metadata in a row, and the last one's
    /// tick.
    flip_backs: u32,
    flipped_back_at_tick: u64,
    /// Two routes share the name (see the module's documentation).
    ambiguous: bool,
    read_at_tick: u64,
}

impl RouteMetadataCache {
    /// A cache for a worker whose ticks are `tick_us` apart.
    pub fn new(tick_us: u64) -> Self {
        RouteMetadataCache {
            entries: Vec::new(),
            fresh_ticks: fresh_ticks(tick_us),
        }
    }

    /// The overrides last read for the route, if read within the fresh
    /// ticks of `tick`; `None`: read the property (and `remember` it).
    pub fn get(&self, cluster: &[u8], route: &[u8], tick: u64) -> Option<&[u8]> {
        if route.is_empty() {
            return None;
        }
        self.entries
            .iter()
            .find(|e| *e.route == *route && *e.cluster == *cluster)
            .filter(|e| !e.ambiguous && tick.saturating_sub(e.read_at_tick) < self.fresh_ticks)
            .map(|e| &*e.metadata)
    }

    /// Keeps what the property said for the route at `tick`. Returns
    /// whether the name is ambiguous, and whether it has just been found so
    /// (to be said once).
    pub fn remember(
        &mut self,
        cluster: &[u8],
        route: &[u8],
        metadata: &[u8],
        tick: u64,
    ) -> Ambiguity {
        if route.is_empty() {
            return Ambiguity::default();
        }
        if let Some(e) = self
            .entries
            .iter_mut()
            .find(|e| *e.route == *route && *e.cluster == *cluster)
        {
            let was = e.ambiguous;
            let quiet = UNAMBIGUOUS_AFTER_SECONDS.saturating_mul(self.fresh_ticks);
            if e.ambiguous && tick.saturating_sub(e.changed_at_tick) > quiet {
                // ten minutes of one metadata: a name again
                e.ambiguous = false;
                e.flip_backs = 0;
            }
            if *e.metadata != *metadata {
                let flip_window = FLIP_BACK_SECONDS.saturating_mul(self.fresh_ticks);
                let flip_back = e.previous.as_deref() == Some(metadata)
                    && tick.saturating_sub(e.changed_at_tick) <= flip_window;
                if flip_back {
                    e.flip_backs = e.flip_backs.saturating_add(1);
                    e.flipped_back_at_tick = tick;
                } else if tick.saturating_sub(e.flipped_back_at_tick) > flip_window {
                    // flip-backs count within a minute of each other; other
                    // changes between them (a third route of the name) do
                    // not start the count again
                    e.flip_backs = 0;
                }
                // once ambiguous, only a quiet spell (above) ends it: three
                // routes of one name change it at every read
                e.ambiguous |= e.flip_backs >= FLIP_BACKS;
                e.previous = Some(std::mem::replace(&mut e.metadata, metadata.into()));
                e.changed_at_tick = tick;
            }
            e.read_at_tick = tick;
            return Ambiguity {
                ambiguous: e.ambiguous,
                found_now: e.ambiguous && !was,
            };
        }
        if self.entries.len() >= MAX_ROUTES {
            if let Some(stalest) = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| e.read_at_tick)
                .map(|(i, _)| i)
            {
                self.entries.swap_remove(stalest);
            }
        }
        self.entries.push(Entry {
            cluster: cluster.into(),
            route: route.into(),
            metadata: metadata.into(),
            previous: None,
            changed_at_tick: tick,
            flip_backs: 0,
            flipped_back_at_tick: 0,
            ambiguous: false,
            read_at_tick: tick,
        });
        Ambiguity::default()
    }
}

/// What `remember` found of a route's name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ambiguity {
    pub ambiguous: bool,
    pub found_now: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    const FRESH_TICKS: u64 = 5;

    #[test]
    fn a_route_is_read_again_after_its_fresh_ticks() {
        let mut cache = RouteMetadataCache::new(200_000);
        assert_eq!(cache.get(b"c", b"r", 0), None);
        cache.remember(b"c", b"r", b"meta", 10);
        assert_eq!(cache.get(b"c", b"r", 10), Some(&b"meta"[..]));
        assert_eq!(
            cache.get(b"c", b"r", 10 + FRESH_TICKS - 1),
            Some(&b"meta"[..])
        );
        assert_eq!(cache.get(b"c", b"r", 10 + FRESH_TICKS), None);
        // xDS changed the route: the new bytes from the next read
        cache.remember(b"c", b"r", b"", 20);
        assert_eq!(cache.get(b"c", b"r", 21), Some(&b""[..]));
    }

    /// A second's worth of ticks, whatever the tick: a route turned off is
    /// followed within about a second at a `sync_interval` of 10 ms or
    /// 300 ms, and within one tick past a second.
    #[test]
    fn an_entry_is_trusted_for_about_a_second() {
        assert_eq!(fresh_ticks(200_000), FRESH_TICKS);
        assert_eq!(fresh_ticks(10_000), 100);
        assert_eq!(fresh_ticks(300_000), 4);
        assert_eq!(fresh_ticks(10_000_000), 1);
        assert_eq!(fresh_ticks(0), 1_000_000);
        let mut cache = RouteMetadataCache::new(10_000_000);
        cache.remember(b"c", b"r", b"meta", 3);
        assert_eq!(cache.get(b"c", b"r", 3), Some(&b"meta"[..]));
        assert_eq!(
            cache.get(b"c", b"r", 4),
            None,
            "read again at the next tick"
        );
    }

    #[test]
    fn routes_are_told_apart_by_cluster_and_unnamed_ones_are_not_kept() {
        let mut cache = RouteMetadataCache::new(200_000);
        cache.remember(b"a", b"r", b"one", 0);
        cache.remember(b"b", b"r", b"two", 0);
        assert_eq!(cache.get(b"a", b"r", 0), Some(&b"one"[..]));
        assert_eq!(cache.get(b"b", b"r", 0), Some(&b"two"[..]));
        cache.remember(b"a", b"", b"three", 0);
        assert_eq!(cache.get(b"a", b"", 0), None);
    }

    /// One name, two routes of different overrides (two virtual hosts):
    /// A, B, A, B is no xDS update; the name is not trusted until ten
    /// minutes pass without going back. A change that stays is an update.
    #[test]
    fn a_name_whose_overrides_flip_back_is_ambiguous() {
        let mut cache = RouteMetadataCache::new(200_000);
        let none = Ambiguity::default();
        assert_eq!(cache.remember(b"c", b"default", b"", 0), none);
        assert_eq!(cache.remember(b"c", b"default", b"off", 5), none);
        assert_eq!(cache.remember(b"c", b"default", b"off", 10), none);
        assert_eq!(cache.get(b"c", b"default", 10), Some(&b"off"[..]));
        // once back: a rollback, maybe
        assert_eq!(cache.remember(b"c", b"default", b"", 15), none);
        let found = cache.remember(b"c", b"default", b"off", 16);
        assert_eq!(
            found,
            Ambiguity {
                ambiguous: true,
                found_now: true
            }
        );
        assert_eq!(cache.get(b"c", b"default", 16), None, "read every time");
        let again = cache.remember(b"c", b"default", b"", 17);
        assert_eq!(
            again,
            Ambiguity {
                ambiguous: true,
                found_now: false
            }
        );
        // a third route of the name: still ambiguous at every change
        for (i, m) in [&b"third"[..], b"", b"off", b"third"].iter().enumerate() {
            assert!(cache.remember(b"c", b"default", m, 18 + i as u64).ambiguous);
        }
        assert!(!cache.remember(b"c", b"default", b"", 22).found_now);
        // ten minutes of the same overrides: a name again
        let quiet = 600 * FRESH_TICKS;
        assert_eq!(cache.remember(b"c", b"default", b"", 23 + quiet), none);
        assert_eq!(cache.get(b"c", b"default", 23 + quiet), Some(&b""[..]));
        // another cluster's route of that name is its own
        assert_eq!(cache.remember(b"d", b"default", b"off", 16), none);
        // a rollback more than a minute after the change is an update
        let minute = 60 * FRESH_TICKS;
        assert_eq!(cache.remember(b"d", b"default", b"on", 20), none);
        assert_eq!(cache.remember(b"d", b"default", b"off", 21 + minute), none);
        assert_eq!(cache.get(b"d", b"default", 22 + minute), Some(&b"off"[..]));
    }

    #[test]
    fn the_stalest_route_makes_room() {
        let mut cache = RouteMetadataCache::new(200_000);
        for i in 0..MAX_ROUTES as u64 {
            cache.remember(b"c", format!("r{i}").as_bytes(), b"m", i);
        }
        cache.remember(b"c", b"new", b"m", 100);
        assert_eq!(cache.entries.len(), MAX_ROUTES);
        assert_eq!(cache.get(b"c", b"r0", 100), None, "the stalest went");
        assert_eq!(cache.get(b"c", b"new", 100), Some(&b"m"[..]));
    }
}
