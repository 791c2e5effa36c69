//! What Envoy's admin interface says of the clusters' hosts: their weights,
//! and whether Envoy would send them traffic (`admin_cluster`).
//!
//! Why: the `override_host` policy sends a request to the host its header
//! names whatever Envoy thinks of that host's health. A host failing active
//! health checks, ejected by outlier detection or being removed still gets
//! every request the filter names it in, and no property tells a filter a
//! host's health or its load-balancing weight. Envoy's admin `/clusters`
//! does: one line per host and fact (`cluster::address::weight::3`,
//! `cluster::address::health_flags::healthy`). One worker at a time reads
//! it (the claim below), every `admin_refresh`, through a cluster that
//! reaches the admin listener; all workers read the result from shared
//! memory on their ticks.
//!
//! What the filter does with it (`hosts`): a host Envoy does not call
//! healthy, or does not list at all, is never named; the score divides
//! by the weight. A read older than `STALE_READS` refreshes is not
//! trusted: the hosts are then chosen as without it.
//!
//! The same text says which clusters run outlier detection (their
//! `cluster::outlier::` lines), and for those the configuration dump says
//! whether it splits local-origin errors: a cluster without outlier
//! detection, or with it unsplit (where an armed request's timeout comes as
//! the 204 it asked for), has nothing the filter's outlier pacing could
//! spare (`timeouts`), so it is not paced.

use std::collections::BTreeMap;

use super::shared_state::{DecodeError, Reader, MAX_HOST_ADDRESS};

const MAGIC: &[u8; 3] = b"AHM";
/// The shared value's encoding (also in its key: `shared_state::membership_key`).
pub const VERSION: u8 = 3;
/// A cluster with more hosts than this is left out of the read (its hosts
/// are chosen as without it): the value stays bounded.
pub const MAX_MEMBERS: usize = 1024;
/// The names of the clusters to read go into the admin request as a
/// regular expression (`/clusters?filter=`); past this length (the admin
/// listener takes request headers up to 60 KiB) the whole `/clusters` is
/// read instead, and the clusters not asked for are dropped from it.
pub const MAX_FILTER_BYTES: usize = 32 * 1024;
/// The shared value holds at most this much (clusters past it, in name
/// order, are left out: their hosts are chosen as without a read), after
/// its header.
pub const MAX_VALUE_BYTES: usize = 1 << 20;
/// The value's header: magic, version, two times and the clusters' count
/// (what the shared-memory cap counts beside `MAX_VALUE_BYTES`).
pub const HEADER_BYTES: usize = 3 + 1 + 8 + 8 + 4;
/// Reads older than this many periods (`admin_refresh`, or the tick if
/// longer) are not trusted.
pub const STALE_READS: u64 = 3;
/// A time this far ahead of the clock is the clock's step back, not a
/// claim or a read to trust (ms).
const CLOCK_SLACK_MS: u64 = 1_000;
/// Health flags with which Envoy's own balancer sends a host nothing (as
/// `/clusters` writes them). Not among them: `degraded_*` (used when
/// healthy hosts are scarce), `active_hc_timeout` (a check timed out, the
/// host not yet unhealthy), `pending_dynamic_removal` (removed, but served
/// until its checks fail).
const EXCLUDING_FLAGS: &[&str] = &[
    "failed_active_hc",
    "failed_outlier_check",
    "failed_eds_health",
    "eds_status_draining",
    "pending_active_hc",
    "excluded_via_immediate_hc_fail",
];
/// Health flags with which Envoy leaves a host out of its priority's count
/// for the load and the panic threshold (its `excludeBasedOnHealthFlag`).
/// Counted as unhealthy members instead, a cluster scaled from 3 to 8 with
/// `ignore_new_hosts_until_first_hc` read as a panic (3 of 8 healthy)
/// where Envoy sees 3 of 3, and the filter named no host until the checks
/// passed (found by a review).
const EXCLUDED_FLAGS: &[&str] = &[
    "pending_active_hc",
    "excluded_via_immediate_hc_fail",
    "eds_status_draining",
];

/// One host of a cluster, as the admin interface lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// As Envoy writes it, the same string as `upstream.address`.
    pub address: String,
    pub weight: u32,
    /// None of Envoy's health flags keeps its balancer off the host
    /// (`EXCLUDING_FLAGS`).
    pub healthy: bool,
    /// A `degraded_*` flag: Envoy's balancer uses the host only when a
    /// priority's healthy hosts are too few (not counted as healthy in
    /// `serving`).
    pub degraded: bool,
    /// `EXCLUDED_FLAGS`: out of its priority's count.
    pub excluded: bool,
    /// The host's priority (0 the first; Istio puts other localities'
    /// hosts at 1, 2... when it fails over between them).
    pub priority: u32,
}

/// Envoy's default overprovisioning factor, 140% (as a fraction, 7/5): a
/// priority takes all the traffic while at least 1/1.4 of its hosts are
/// healthy (Envoy computes 140 x healthy / total in integers).
const OVERPROVISIONING: (usize, usize) = (7, 5);

/// Where Envoy's balancer sends a cluster's traffic, by its members'
/// priorities.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Serving {
    /// One priority: every member.
    All,
    /// Several, and the first has enough healthy hosts to take all of it:
    /// only those at this priority (a host of another locality is never
    /// named while the local ones serve).
    Only(u32),
    /// Several, and the first spills over to the next: Envoy splits the
    /// traffic between them by their health, which the filter leaves to it.
    Spread,
}

/// Where Envoy sends `members`' traffic (`Serving`): the priority load
/// with the default overprovisioning, counted by hosts as Envoy does
/// (excluded hosts out of the count, degraded ones not healthy: Envoy
/// places the healthy load first). A priority with no healthy host takes
/// nothing; the first with some takes everything if it has enough.
pub fn serving(members: &[Member]) -> Serving {
    let priorities = counts(members);
    if priorities.len() <= 1 {
        return Serving::All;
    }
    match priorities.iter().find(|(_, (_, healthy))| *healthy > 0) {
        Some((&p, &counted)) if enough_healthy(counted) => Serving::Only(p),
        _ => Serving::Spread,
    }
}

/// Each priority's hosts, as Envoy counts them for its load: (all but the
/// excluded, the healthy ones not degraded).
fn counts(members: &[Member]) -> BTreeMap<u32, (usize, usize)> {
    let mut priorities: BTreeMap<u32, (usize, usize)> = BTreeMap::new();
    for m in members {
        let (total, healthy) = priorities.entry(m.priority).or_default();
        *total += usize::from(!m.excluded);
        *healthy += usize::from(m.healthy && !m.degraded && !m.excluded);
    }
    priorities
}

/// Healthy hosts enough to take all of their priority's load (the default
/// overprovisioning).
fn enough_healthy((total, healthy): (usize, usize)) -> bool {
    let (times, per) = OVERPROVISIONING;
    times * healthy >= per * total
}

/// The priorities whose degraded hosts Envoy's balancer sends nothing: their
/// healthy hosts are enough (Envoy places the healthy load first, and the
/// degraded load only for what the healthy hosts cannot take). An active
/// health check marks a host degraded to drain it, say.
pub fn degraded_unserved(members: &[Member]) -> Vec<u32> {
    counts(members)
        .into_iter()
        .filter(|&(_, counted)| enough_healthy(counted))
        .map(|(p, _)| p)
        .collect()
}

/// The member of `members` (sorted by address, as a read keeps them) at
/// `address`, as `upstream.address` writes it.
pub fn find<'a>(members: &'a [Member], address: &str) -> Option<&'a Member> {
    members
        .binary_search_by(|m| m.address.as_str().cmp(address))
        .ok()
        .and_then(|i| members.get(i))
}

/// Whether Envoy's balancer may send `member` traffic where the cluster is
/// served so: every member but those outside the serving priority.
pub fn in_service(member: &Member, serving: Serving) -> bool {
    match serving {
        Serving::Only(p) => member.priority == p,
        Serving::All | Serving::Spread => true,
    }
}

/// What outlier detection on a cluster makes of a hedge's per-try timeout,
/// as the admin interface says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutlierDetection {
    /// No outlier detector: nothing counts it.
    Off,
    /// A detector; whether it splits local-origin errors is not known.
    On,
    /// A detector that does not split them: an armed request's timeout
    /// reaches it as the 204 the request asked for, no failure.
    Unsplit,
    /// A detector that does: every timeout is a local-origin failure.
    Split,
}

impl OutlierDetection {
    /// Whether a fired per-try timeout may count as a failure there (what
    /// the pacing spares); not known counts.
    pub fn counts_timeouts(self) -> bool {
        matches!(self, OutlierDetection::On | OutlierDetection::Split)
    }

    /// Whether the code a per-try timeout is reported with may reach a
    /// detector there (`x-envoy-upstream-rq-timeout-alt-response` matters):
    /// not without a detector, nor where local-origin errors are split
    /// (the timeout counts as one whatever its code); not known: it may.
    pub fn reads_timeout_code(self) -> bool {
        matches!(self, OutlierDetection::On | OutlierDetection::Unsplit)
    }

    fn code(self) -> u8 {
        match self {
            OutlierDetection::Off => 0,
            OutlierDetection::On => 1,
            OutlierDetection::Unsplit => 2,
            OutlierDetection::Split => 3,
        }
    }
}

/// The last read of the admin interface, shared by all workers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Membership {
    /// When the admin interface was last read successfully (ms); 0: never.
    pub read_ms: u64,
    /// When a worker last claimed a read (ms): the others wait a period.
    pub claimed_ms: u64,
    /// Each cluster's members, sorted by address.
    pub clusters: BTreeMap<String, Vec<Member>>,
    /// Of `clusters`, those Envoy runs outlier detection on (the others
    /// have none).
    pub outlier_detection: BTreeMap<String, OutlierDetection>,
}

impl Membership {
    /// Whether a read is due: the last claim is a refresh period old (a
    /// worker whose read failed, or whose VM went, leaves it to the next
    /// period's claim).
    pub fn due(&self, now_ms: u64, refresh_ms: u64) -> bool {
        self.claimed_ms == 0
            || self.claimed_ms > now_ms.saturating_add(CLOCK_SLACK_MS)
            || now_ms.saturating_sub(self.claimed_ms) >= refresh_ms
    }

    /// `cluster`'s members, if the last read is recent (within
    /// `STALE_READS` x `period_ms`) and listed it.
    pub fn members(&self, cluster: &str, now_ms: u64, period_ms: u64) -> Option<&[Member]> {
        let fresh = self.read_ms > 0
            && self.read_ms <= now_ms.saturating_add(CLOCK_SLACK_MS)
            && now_ms.saturating_sub(self.read_ms) <= STALE_READS.saturating_mul(period_ms);
        fresh
            .then(|| self.clusters.get(cluster).map(Vec::as_slice))
            .flatten()
    }

    /// Whether Envoy runs outlier detection on `cluster`, if the last read
    /// is recent and listed it (as `members`).
    pub fn outlier_detection(
        &self,
        cluster: &str,
        now_ms: u64,
        period_ms: u64,
    ) -> Option<OutlierDetection> {
        self.members(cluster, now_ms, period_ms).map(|_| {
            self.outlier_detection
                .get(cluster)
                .copied()
                .unwrap_or(OutlierDetection::Off)
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.extend_from_slice(&self.read_ms.to_le_bytes());
        out.extend_from_slice(&self.claimed_ms.to_le_bytes());
        let clusters = self.clusters.iter().filter(|(name, members)| {
            name.len() <= usize::from(u16::MAX) && members.len() <= MAX_MEMBERS
        });
        out.extend_from_slice(&(clusters.clone().count() as u32).to_le_bytes());
        for (name, members) in clusters {
            out.extend_from_slice(&(name.len() as u16).to_le_bytes());
            out.extend_from_slice(name.as_bytes());
            out.push(self.outlier_detection.get(name).map_or(0, |o| o.code()));
            let members: Vec<&Member> = members
                .iter()
                .filter(|m| m.address.len() <= MAX_HOST_ADDRESS)
                .collect();
            out.extend_from_slice(&(members.len() as u16).to_le_bytes());
            for m in members {
                out.push(m.address.len() as u8);
                out.extend_from_slice(m.address.as_bytes());
                out.extend_from_slice(&m.weight.to_le_bytes());
                out.push(
                    u8::from(m.healthy) | u8::from(m.degraded) << 1 | u8::from(m.excluded) << 2,
                );
                out.extend_from_slice(&m.priority.to_le_bytes());
            }
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        if r.take(3)? != MAGIC {
            return Err(DecodeError::BadMagic);
        }
        let version = r.u8()?;
        if version != VERSION {
            return Err(DecodeError::UnsupportedVersion(version));
        }
        let read_ms = r.u64()?;
        let claimed_ms = r.u64()?;
        let count = r.u32()?;
        let mut clusters = BTreeMap::new();
        let mut outlier_detection = BTreeMap::new();
        for _ in 0..count {
            let len = usize::from(r.u16()?);
            let name = text(&mut r, len)?;
            let outlier = match r.u8()? {
                0 => OutlierDetection::Off,
                1 => OutlierDetection::On,
                2 => OutlierDetection::Unsplit,
                3 => OutlierDetection::Split,
                _ => return Err(DecodeError::Corrupt("outlier detection")),
            };
            if outlier != OutlierDetection::Off {
                outlier_detection.insert(name.clone(), outlier);
            }
            let n = usize::from(r.u16()?);
            if n > MAX_MEMBERS {
                return Err(DecodeError::Corrupt("too many members"));
            }
            let mut members = Vec::with_capacity(n);
            for _ in 0..n {
                let len = usize::from(r.u8()?);
                if len > MAX_HOST_ADDRESS {
                    return Err(DecodeError::Corrupt("address too long"));
                }
                let address = text(&mut r, len)?;
                let weight = r.u32()?;
                let flags = r.u8()?;
                if flags > 0b111 {
                    return Err(DecodeError::Corrupt("health flag"));
                }
                let priority = r.u32()?;
                members.push(Member {
                    address,
                    weight,
                    healthy: flags & 1 != 0,
                    degraded: flags & 2 != 0,
                    excluded: flags & 4 != 0,
                    priority,
                });
            }
            clusters.insert(name, members);
        }
        if !r.is_done() {
            return Err(DecodeError::Corrupt("trailing bytes"));
        }
        Ok(Membership {
            read_ms,
            claimed_ms,
            clusters,
            outlier_detection,
        })
    }
}

/// `len` bytes of UTF-8.
fn text(r: &mut Reader<'_>, len: usize) -> Result<String, DecodeError> {
    std::str::from_utf8(r.take(len)?)
        .map(str::to_string)
        .map_err(|_| DecodeError::Corrupt("not UTF-8"))
}

/// The members of the `wanted` clusters in the admin interface's
/// `/clusters` text, at most `MAX_VALUE_BYTES` of them encoded. Its host
/// lines are `cluster::address::fact::value`; an IPv6 address holds `::`
/// itself, so the fact and value are taken from the end. Other lines (the
/// cluster's own facts, `cluster::fact::value`, or
/// `cluster::default_priority::max_connections::1024`) name no weight or
/// health and are skipped.
pub fn parse_admin_clusters(
    text: &[u8],
    wanted: impl Fn(&str) -> bool,
) -> BTreeMap<String, Vec<Member>> {
    let mut clusters: BTreeMap<String, Vec<Member>> = BTreeMap::new();
    let text = String::from_utf8_lossy(text);
    for line in text.lines() {
        let Some((cluster, rest)) = wanted_cluster(line, &wanted) else {
            continue;
        };
        let Some((head, value)) = rest.rsplit_once("::") else {
            continue;
        };
        let Some((address, fact)) = head.rsplit_once("::") else {
            continue;
        };
        if !["weight", "health_flags", "priority"].contains(&fact)
            || address.is_empty()
            || address.len() > MAX_HOST_ADDRESS
        {
            continue;
        }
        let members = clusters.entry(cluster.to_string()).or_default();
        // a host's lines come together: it is the last one, or a new one
        let member = match members.last_mut() {
            Some(last) if last.address == address => last,
            _ => {
                members.push(Member {
                    address: address.to_string(),
                    weight: 1,
                    healthy: true,
                    degraded: false,
                    excluded: false,
                    priority: 0,
                });
                let Some(last) = members.last_mut() else {
                    continue;
                };
                last
            }
        };
        if fact == "weight" {
            // any uint32 from 1 (v3 `load_balancing_weight`)
            member.weight = value.trim().parse::<u32>().unwrap_or(1).max(1);
        } else if fact == "priority" {
            member.priority = value.trim().parse::<u32>().unwrap_or(0);
        } else {
            let flags = || value.split('/').map(str::trim);
            member.healthy = !flags().any(|flag| EXCLUDING_FLAGS.contains(&flag));
            member.degraded = flags().any(|flag| flag.starts_with("degraded_"));
            member.excluded = flags().any(|flag| EXCLUDED_FLAGS.contains(&flag));
        }
    }
    clusters.retain(|_, members| members.len() <= MAX_MEMBERS);
    let mut bytes = 0usize;
    clusters.retain(|name, members| {
        let size = 5 + name.len() + members.iter().map(|m| 10 + m.address.len()).sum::<usize>();
        bytes = bytes.saturating_add(size);
        bytes <= MAX_VALUE_BYTES
    });
    for members in clusters.values_mut() {
        members.sort_by(|a, b| a.address.cmp(&b.address));
        // a host listed twice (two priorities) is healthy only if both
        // say so, and served at the first
        members.dedup_by(|later, kept| {
            let same = later.address == kept.address;
            if same {
                kept.healthy &= later.healthy;
                kept.degraded |= later.degraded;
                kept.excluded |= later.excluded;
                kept.priority = kept.priority.min(later.priority);
            }
            same
        });
    }
    clusters
}

/// Whether the admin interface's `/clusters` text lists a cluster named
/// `name`: any line of it, since a cluster without hosts (yet) has lines
/// of its own facts (`name::default_priority::max_connections::1024`).
pub fn lists_cluster(text: &str, name: &str) -> bool {
    text.lines().any(|line| {
        line.strip_prefix(name)
            .is_some_and(|rest| rest.starts_with("::"))
    })
}

/// Of the `wanted` clusters in the admin interface's `/clusters` text,
/// those with outlier detection: Envoy writes its
/// `cluster::outlier::success_rate_average::…` lines (and three more) for
/// a cluster with an outlier detector, and none for one without (whether
/// it splits local-origin errors is not there: `OutlierDetection::On`).
pub fn parse_outlier_detection(
    text: &[u8],
    wanted: impl Fn(&str) -> bool,
) -> BTreeMap<String, OutlierDetection> {
    let text = String::from_utf8_lossy(text);
    text.lines()
        .filter_map(|line| wanted_cluster(line, &|c: &str| wanted(c)))
        .filter(|(_, rest)| rest.starts_with("outlier::"))
        .map(|(cluster, _)| (cluster.to_string(), OutlierDetection::On))
        .collect()
}

/// A line's cluster, among the `wanted`, and the rest after its `::`. A
/// cluster's name may hold `::` itself (Envoy allows it): each `::` is
/// tried from the left, and the first name wanted is taken (before, a
/// cluster `a::b` was read as `a`, and never found). Not told apart: `a`
/// and `a::b` both tracked (`a::b`'s lines would read as `a`'s); taking
/// the longest name instead misreads IPv6 addresses wherever any name is
/// wanted (the fuzz target's, the tests').
fn wanted_cluster<'a>(line: &'a str, wanted: &dyn Fn(&str) -> bool) -> Option<(&'a str, &'a str)> {
    line.match_indices("::")
        .filter_map(|(at, _)| Some((line.get(..at)?, line.get(at + 2..)?)))
        .find(|(cluster, _)| wanted(cluster))
}

/// The size, about (a character a node, two per alternative and the
/// anchors), of the largest `name_regex` put in a configuration dump's
/// request: under Envoy's default limit of 100 with a margin.
const MAX_NAME_REGEX_PROGRAM: usize = 60;

/// The names of `clusters` as an admin query parameter: a regular
/// expression matching exactly those names (metacharacters escaped, then
/// percent-encoded); `None` without a name, or past `MAX_FILTER_BYTES`.
fn names_parameter<'a>(clusters: impl IntoIterator<Item = &'a str>) -> Option<Option<String>> {
    let mut regex = String::from("^(?:");
    let mut any = false;
    for name in clusters {
        if any {
            regex.push('|');
        }
        any = true;
        for c in name.chars() {
            // RE2 takes a backslash before ASCII punctuation only
            if c.is_ascii() && !(c.is_ascii_alphanumeric() || c == '_') {
                regex.push('\\');
            }
            regex.push(c);
        }
    }
    if !any {
        return None;
    }
    regex.push_str(")$");
    let mut encoded = String::new();
    for b in regex.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            encoded.push(char::from(b));
        } else {
            encoded.push_str(&format!("%{b:02X}"));
        }
    }
    Some((encoded.len() <= MAX_FILTER_BYTES).then_some(encoded))
}

/// The admin request's path for `clusters`: `/clusters` with a filter that
/// matches exactly those names, or the whole `/clusters` when the filter
/// would be longer than `MAX_FILTER_BYTES`. `None` without a cluster to
/// read.
pub fn admin_path<'a>(clusters: impl IntoIterator<Item = &'a str>) -> Option<String> {
    Some(match names_parameter(clusters)? {
        Some(names) => format!("/clusters?filter={names}"),
        None => "/clusters".to_string(),
    })
}

/// The configuration dump's paths for `clusters`' outlier detection: the
/// dynamic clusters' (xDS: Istio, Envoy Gateway) and the static ones', each
/// masked to the name and the outlier detection (the dump takes one
/// resource type per request).
pub fn config_dump_paths<'a>(clusters: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let clusters: Vec<&str> = clusters.into_iter().collect();
    let Some(names) = names_parameter(clusters.iter().copied()) else {
        return Vec::new();
    };
    // Envoy compiles the dump's `name_regex` under its regex engine's
    // program size limit (runtime `re2.max_program_size.error_level`, 100
    // unless raised: Istio and Envoy Gateway raise it, a plain bootstrap
    // does not), and refuses a longer one with a 400: past a few names the
    // dump is asked for whole (masked, about 100 bytes a cluster) and the
    // names picked from it. Before, three clusters with Istio-like names
    // were enough for every read to fail.
    let size: usize = clusters.iter().map(|c| c.len() + 2).sum::<usize>() + 8;
    let names = match names {
        Some(n) if size <= MAX_NAME_REGEX_PROGRAM => format!("&name_regex={n}"),
        _ => String::new(),
    };
    ["dynamic_active_clusters", "static_clusters"]
        .iter()
        .map(|resource| {
            format!(
                "/config_dump?resource={resource}&mask=cluster.name,cluster.outlier_detection{names}"
            )
        })
        .collect()
}

/// Whether each cluster in a configuration dump (`config_dump_paths`) with
/// outlier detection splits local-origin errors. A cluster without
/// outlier detection there is left out; an answer that is not a dump is an
/// error.
pub fn parse_config_dump(json: &[u8]) -> Result<BTreeMap<String, bool>, String> {
    #[derive(serde::Deserialize)]
    struct Dump {
        #[serde(default)]
        configs: Vec<Entry>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        cluster: Option<Cluster>,
    }
    #[derive(serde::Deserialize)]
    struct Cluster {
        #[serde(default)]
        name: String,
        outlier_detection: Option<Outlier>,
    }
    #[derive(serde::Deserialize)]
    struct Outlier {
        #[serde(default)]
        split_external_local_origin_errors: bool,
    }
    let dump: Dump = serde_json::from_slice(json).map_err(|e| format!("not a dump: {e}"))?;
    Ok(dump
        .configs
        .into_iter()
        .filter_map(|e| e.cluster)
        .filter_map(|c| {
            Some((
                c.name,
                c.outlier_detection?.split_external_local_origin_errors,
            ))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What Envoy 1.40's `/clusters` printed for a cluster with active
    /// health checks and outlier detection (trimmed: each host's counters,
    /// one IPv6 host), and one with neither.
    const ADMIN_TEXT: &str = "\
outbound|80||svc.ns::observability_name::outbound|80||svc.ns
outbound|80||svc.ns::outlier::success_rate_average::-1
outbound|80||svc.ns::outlier::success_rate_ejection_threshold::-1
outbound|80||svc.ns::outlier::local_origin_success_rate_average::-1
outbound|80||svc.ns::outlier::local_origin_success_rate_ejection_threshold::-1
outbound|80||svc.ns::default_priority::max_connections::1024
outbound|80||svc.ns::added_via_api::false
outbound|80||svc.ns::127.0.0.1:19931::cx_active::0
outbound|80||svc.ns::127.0.0.1:19931::hostname::
outbound|80||svc.ns::127.0.0.1:19931::health_flags::/failed_active_hc
outbound|80||svc.ns::127.0.0.1:19931::weight::3
outbound|80||svc.ns::127.0.0.1:19931::zone::
outbound|80||svc.ns::127.0.0.1:19931::success_rate::-1
outbound|80||svc.ns::127.0.0.1:19932::rq_total::0
outbound|80||svc.ns::127.0.0.1:19932::health_flags::healthy
outbound|80||svc.ns::127.0.0.1:19932::weight::1
outbound|80||svc.ns::[::1]:19933::cx_active::0
outbound|80||svc.ns::[::1]:19933::health_flags::/failed_outlier_check
outbound|80||svc.ns::[::1]:19933::weight::1
other::10.0.0.1:80::health_flags::healthy
other::10.0.0.1:80::weight::7
";

    /// A cluster's `outlier::` lines say it has outlier detection; only the
    /// clusters wanted count.
    #[test]
    fn the_admin_text_says_which_clusters_run_outlier_detection() {
        let all = parse_outlier_detection(ADMIN_TEXT.as_bytes(), |_| true);
        assert_eq!(
            all.into_iter().collect::<Vec<_>>(),
            [("outbound|80||svc.ns".to_string(), OutlierDetection::On)]
        );
        let none = parse_outlier_detection(ADMIN_TEXT.as_bytes(), |c| c == "other");
        assert!(none.is_empty());
        // a host line is no cluster line, whatever it says
        let host = "c::10.0.0.1:80::outlier::1\n";
        assert!(parse_outlier_detection(host.as_bytes(), |_| true).is_empty());
    }

    #[test]
    fn the_admin_text_gives_each_host_its_weight_and_health() {
        let clusters = parse_admin_clusters(ADMIN_TEXT.as_bytes(), |_| true);
        let member = |a: &str, w: u32, h: bool| Member {
            priority: 0,
            degraded: false,
            excluded: false,
            address: a.into(),
            weight: w,
            healthy: h,
        };
        assert_eq!(
            clusters.get("outbound|80||svc.ns"),
            Some(&vec![
                member("127.0.0.1:19931", 3, false),
                member("127.0.0.1:19932", 1, true),
                member("[::1]:19933", 1, false),
            ])
        );
        assert_eq!(
            clusters.get("other"),
            Some(&vec![member("10.0.0.1:80", 7, true)])
        );
        assert_eq!(clusters.len(), 2);
    }

    /// Istio's locality failover puts the other zones' hosts at priority
    /// 1, 2...: while the first priority has enough healthy hosts, Envoy
    /// sends it everything, and so must the filter; past that it spills.
    #[test]
    fn the_priorities_say_where_envoy_sends_the_traffic() {
        let text = "\
c::10.0.0.1:80::health_flags::healthy\nc::10.0.0.1:80::priority::0
c::10.0.0.2:80::health_flags::healthy\nc::10.0.0.2:80::priority::0
c::10.0.0.3:80::health_flags::healthy\nc::10.0.0.3:80::priority::0
c::10.1.0.1:80::health_flags::healthy\nc::10.1.0.1:80::priority::1
";
        let clusters = parse_admin_clusters(text.as_bytes(), |_| true);
        let c = clusters["c"].clone();
        assert_eq!(
            c.iter().map(|m| m.priority).collect::<Vec<_>>(),
            [0, 0, 0, 1]
        );
        assert_eq!(serving(&c), Serving::Only(0));
        // one of three down: 2/3 x 1.4 is 93%, the rest spills to the next
        let mut one_down = c.clone();
        one_down[0].healthy = false;
        assert_eq!(serving(&one_down), Serving::Spread);
        // of four, one down: 3/4 x 1.4 covers it all
        let mut four = c.clone();
        four[3].priority = 0;
        four.push(Member {
            address: "10.1.0.2:80".into(),
            weight: 1,
            healthy: true,
            degraded: false,
            excluded: false,
            priority: 1,
        });
        four[0].healthy = false;
        assert_eq!(serving(&four), Serving::Only(0));
        // every local host down: the other locality takes it all
        let mut failed_over = c.clone();
        for m in &mut failed_over[..3] {
            m.healthy = false;
        }
        assert_eq!(serving(&failed_over), Serving::Only(1));
        failed_over[3].healthy = false;
        assert_eq!(serving(&failed_over), Serving::Spread);
        // degraded local hosts: Envoy places the healthy load first, all of
        // it at the other locality
        let mut degraded = c.clone();
        for m in &mut degraded[..3] {
            m.degraded = true;
        }
        assert_eq!(serving(&degraded), Serving::Only(1));
        // an excluded host is out of its priority's count: two of two
        let mut excluded = one_down.clone();
        excluded[0].excluded = true;
        assert_eq!(serving(&excluded), Serving::Only(0));
        // 45 healthy of 63 is 140 x 45 / 63 = 100 in Envoy's integers
        let many: Vec<Member> = (0..64)
            .map(|i| Member {
                address: format!("10.2.0.{i}:80"),
                weight: 1,
                healthy: i < 45 || i == 63,
                degraded: false,
                excluded: false,
                priority: u32::from(i == 63),
            })
            .collect();
        assert_eq!(serving(&many), Serving::Only(0));
        // the flags as Envoy writes them
        let text = "c::a::health_flags::/degraded_active_hc\nc::b::health_flags::/excluded_via_immediate_hc_fail\nc::d::health_flags::/failed_active_hc/pending_active_hc\nc::e::health_flags::/eds_status_draining\nc::f::health_flags::/failed_active_hc\n";
        let flagged = parse_admin_clusters(text.as_bytes(), |_| true);
        let (a, b) = (&flagged["c"][0], &flagged["c"][1]);
        assert!(a.healthy && a.degraded && !a.excluded);
        assert!(!b.healthy && !b.degraded && b.excluded);
        let excluded: Vec<bool> = flagged["c"].iter().map(|m| m.excluded).collect();
        assert_eq!(excluded, [false, true, true, true, false]);
        // one priority, or none listed: every member
        assert_eq!(serving(&c[..3]), Serving::All);
        assert_eq!(serving(&[]), Serving::All);
        // shared with the priorities
        let value = Membership {
            read_ms: 1,
            claimed_ms: 1,
            clusters: clusters.clone(),
            outlier_detection: BTreeMap::new(),
        };
        assert_eq!(Membership::decode(&value.encode()), Ok(value));
        // its key names the encoding: an older filter's value is apart
        let geometry =
            crate::policy::window::WindowGeometry::new(std::time::Duration::from_secs(30));
        let key = crate::policy::shared_state::membership_key(geometry);
        assert!(key.ends_with(&format!("_v{VERSION}")), "{key}");
    }

    /// Envoy allows `::` in a cluster's name: the name wanted is found
    /// whole (the read asks Envoy for the wanted names alone).
    #[test]
    fn a_cluster_name_holding_colons_is_read_whole() {
        let text = "a::b::10.0.0.1:80::weight::2\na::b::[::1]:80::weight::3\na::b::outlier::success_rate_average::-1\n";
        let clusters = parse_admin_clusters(text.as_bytes(), |c| c == "a::b");
        let weights: Vec<u32> = clusters["a::b"].iter().map(|m| m.weight).collect();
        assert_eq!(weights, [2, 3]);
        let outlier = parse_outlier_detection(text.as_bytes(), |c| c == "a::b");
        assert_eq!(outlier.get("a::b"), Some(&OutlierDetection::On));
    }

    #[test]
    fn odd_lines_and_numbers_are_survived() {
        let text =
            "c\nc::\nc::a::weight::\nc::a::weight::x\nc::b::weight::100000\n::::::\n\u{0}::\u{ff}";
        let clusters = parse_admin_clusters(text.as_bytes(), |_| true);
        let c = clusters.get("c").map(Vec::as_slice).unwrap_or_default();
        assert_eq!(c.len(), 2);
        assert_eq!((c[0].weight, c[1].weight), (1, 100_000));
        // only the clusters asked for
        let only = parse_admin_clusters(ADMIN_TEXT.as_bytes(), |c| c == "other");
        assert_eq!(only.keys().collect::<Vec<_>>(), ["other"]);
        // flags that keep Envoy's balancer off a host, and those that do not
        for (flags, healthy) in [
            ("healthy", true),
            ("/failed_active_hc", false),
            ("/degraded_active_hc", true),
            ("/active_hc_timeout", true),
            ("/pending_dynamic_removal", true),
            ("/degraded_eds_health/failed_outlier_check", false),
            ("/eds_status_draining", false),
        ] {
            let line = format!("c::a::health_flags::{flags}\n");
            let c = parse_admin_clusters(line.as_bytes(), |_| true);
            assert_eq!(c["c"][0].healthy, healthy, "{flags}");
        }
        // a host in two priorities: unhealthy in either is unhealthy
        let text =
            "c::a::health_flags::healthy\nc::b::weight::1\nc::a::health_flags::/failed_active_hc\n";
        let clusters = parse_admin_clusters(text.as_bytes(), |_| true);
        let c = clusters.get("c").map(Vec::as_slice).unwrap_or_default();
        assert_eq!(c.len(), 2);
        assert!(!c[0].healthy && c[1].healthy);
        // too many hosts: the cluster is left out
        let many: String = (0..=MAX_MEMBERS)
            .map(|i| format!("big::10.0.{}.{}:80::weight::1\n", i / 256, i % 256))
            .collect();
        assert!(parse_admin_clusters(many.as_bytes(), |_| true).is_empty());
        // many clusters: the value stays under its cap
        let clusters: String = (0..2_000)
            .flat_map(|c| {
                (0..30)
                    .map(move |h| format!("cluster-{c:04}::10.1.{}.{h}:8080::weight::1\n", c % 250))
            })
            .collect();
        let value = Membership {
            read_ms: 1,
            claimed_ms: 1,
            clusters: parse_admin_clusters(clusters.as_bytes(), |_| true),
            outlier_detection: BTreeMap::new(),
        };
        assert!(value.clusters.len() > 1_000 && value.clusters.len() < 2_000);
        assert!(value.encode().len() <= MAX_VALUE_BYTES);
        // what the cap counts is what follows the header (the shared
        // memory cap counts the two apart)
        let counted: usize = value
            .clusters
            .iter()
            .map(|(name, members)| {
                5 + name.len() + members.iter().map(|m| 10 + m.address.len()).sum::<usize>()
            })
            .sum();
        assert!(counted <= MAX_VALUE_BYTES);
        assert_eq!(value.encode().len(), HEADER_BYTES + counted);
        assert_eq!(Membership::default().encode().len(), HEADER_BYTES);
    }

    #[test]
    fn the_shared_value_round_trips_and_refuses_damage() {
        let value = Membership {
            read_ms: 5,
            claimed_ms: 7,
            clusters: parse_admin_clusters(ADMIN_TEXT.as_bytes(), |_| true),
            outlier_detection: parse_outlier_detection(ADMIN_TEXT.as_bytes(), |_| true),
        };
        let bytes = value.encode();
        assert_eq!(Membership::decode(&bytes), Ok(value));
        for cut in 0..bytes.len() {
            assert!(Membership::decode(&bytes[..cut]).is_err(), "{cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(Membership::decode(&longer).is_err());
        assert_eq!(Membership::decode(b"AHC\x01"), Err(DecodeError::BadMagic));
        assert_eq!(
            Membership::decode(b"AHM\x09"),
            Err(DecodeError::UnsupportedVersion(9))
        );
        // an address longer than any the filter tracks does not decode
        // (encoding would drop it: the round trip must hold)
        let mut long = vec![b'A', b'H', b'M', VERSION];
        long.extend_from_slice(&[0; 16]);
        long.extend_from_slice(&1u32.to_le_bytes());
        long.extend_from_slice(&[1, 0, b'c', 0, 1, 0, 200]);
        long.extend_from_slice(&[b'a'; 200]);
        long.extend_from_slice(&[1, 0, 0, 0, 1, 0, 0, 0, 0]);
        assert_eq!(
            Membership::decode(&long),
            Err(DecodeError::Corrupt("address too long"))
        );
    }

    #[test]
    fn a_read_is_trusted_while_recent_and_claimed_once_a_period() {
        let mut m = Membership {
            read_ms: 10_000,
            claimed_ms: 10_000,
            clusters: parse_admin_clusters(ADMIN_TEXT.as_bytes(), |_| true),
            outlier_detection: parse_outlier_detection(ADMIN_TEXT.as_bytes(), |_| true),
        };
        assert!(m.members("other", 10_000 + 3 * 5_000, 5_000).is_some());
        // outlier detection is known for the clusters read, while trusted
        assert_eq!(
            m.outlier_detection("other", 10_000, 5_000),
            Some(OutlierDetection::Off)
        );
        assert_eq!(
            m.outlier_detection("outbound|80||svc.ns", 10_000, 5_000),
            Some(OutlierDetection::On)
        );
        assert_eq!(m.outlier_detection("unknown", 10_000, 5_000), None);
        assert_eq!(
            m.outlier_detection("other", 10_001 + 3 * 5_000, 5_000),
            None
        );
        assert!(m.members("other", 10_001 + 3 * 5_000, 5_000).is_none());
        assert!(m.members("unknown", 10_000, 5_000).is_none());
        assert!(!m.due(14_999, 5_000));
        assert!(m.due(15_000, 5_000));
        // the clock stepped back: a claim in the future is due, a read
        // from the future not trusted
        assert!(m.due(8_000, 5_000));
        assert!(m.members("other", 8_000, 5_000).is_none());
        assert!(m.members("other", 9_500, 5_000).is_some());
        m.read_ms = 0;
        assert!(m.members("other", 10_000, 5_000).is_none());
        assert!(Membership::default().due(0, 5_000));
    }

    #[test]
    fn the_admin_path_matches_exactly_the_names_asked() {
        assert_eq!(admin_path([]), None);
        assert_eq!(
            admin_path(["outbound|80||a.ns", "b"]).as_deref(),
            Some("/clusters?filter=%5E%28%3F%3Aoutbound%5C%7C80%5C%7C%5C%7Ca%5C.ns%7Cb%29%24")
        );
        // RE2 refuses a backslash before a letter beyond ASCII
        assert_eq!(
            admin_path(["café"]).as_deref(),
            Some("/clusters?filter=%5E%28%3F%3Acaf%C3%A9%29%24")
        );
        let many: Vec<String> = (0..5000).map(|i| format!("cluster-{i}")).collect();
        assert_eq!(
            admin_path(many.iter().map(String::as_str)).as_deref(),
            Some("/clusters")
        );
    }

    #[test]
    fn the_config_dump_is_asked_for_each_resource_and_the_names() {
        assert!(config_dump_paths([]).is_empty());
        assert_eq!(
            config_dump_paths(["b"]),
            [
                "/config_dump?resource=dynamic_active_clusters&mask=cluster.name,cluster.outlier_detection&name_regex=%5E%28%3F%3Ab%29%24",
                "/config_dump?resource=static_clusters&mask=cluster.name,cluster.outlier_detection&name_regex=%5E%28%3F%3Ab%29%24",
            ]
        );
        let many: Vec<String> = (0..5000).map(|i| format!("cluster-{i}")).collect();
        assert!(config_dump_paths(many.iter().map(String::as_str))
            .iter()
            .all(|p| !p.contains("name_regex")));
        // three Istio-like names: a regex past Envoy's default program
        // size limit (a 400 for every read), so the whole dump, masked
        let istio = [
            "outbound|8080||payments.default.svc.cluster.local",
            "outbound|8080||search.default.svc.cluster.local",
            "outbound|9090||ratings.default.svc.cluster.local",
        ];
        assert_eq!(
            config_dump_paths(istio),
            [
                "/config_dump?resource=dynamic_active_clusters&mask=cluster.name,cluster.outlier_detection",
                "/config_dump?resource=static_clusters&mask=cluster.name,cluster.outlier_detection",
            ]
        );
    }

    /// What Envoy 1.40 answered to `config_dump_paths` (a static cluster
    /// that splits, one that does not, one without outlier detection), and
    /// to a resource with no cluster matching.
    #[test]
    fn the_config_dump_says_which_clusters_split_local_origin_errors() {
        let dump = br#"{
 "configs": [
  {"@type": "type.googleapis.com/envoy.admin.v3.ClustersConfigDump.StaticCluster",
   "cluster": {"@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster", "name": "backend",
    "outlier_detection": {"split_external_local_origin_errors": true, "consecutive_local_origin_failure": 10}}},
  {"@type": "type.googleapis.com/envoy.admin.v3.ClustersConfigDump.StaticCluster",
   "cluster": {"@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster", "name": "plain",
    "outlier_detection": {"consecutive_5xx": 5}}},
  {"@type": "type.googleapis.com/envoy.admin.v3.ClustersConfigDump.StaticCluster",
   "cluster": {"@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster", "name": "none"}}
 ]
}"#;
        let split = parse_config_dump(dump).unwrap();
        assert_eq!(
            split.into_iter().collect::<Vec<_>>(),
            [("backend".to_string(), true), ("plain".to_string(), false)]
        );
        assert!(parse_config_dump(b"{}").unwrap().is_empty());
        assert!(parse_config_dump(b"cluster::outlier::x").is_err());
    }
}
