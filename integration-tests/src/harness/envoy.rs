//! Runs the real Envoy binary with a config from `envoy-configs/`, rendered
//! onto free loopback ports, and the real `.wasm`.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// `$ENVOY`, else `envoy` on PATH, else the project venv's (`make setup`).
pub fn envoy_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("ENVOY").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    on_path("envoy").unwrap_or_else(|| repo_root().join(".venv/bin/envoy"))
}

/// A program of that name in a `PATH` directory.
pub fn on_path(name: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The Envoy executable itself: the venv's `envoy` is a Python launcher,
/// which tools such as valgrind must not be pointed at.
pub fn envoy_executable() -> PathBuf {
    let binary = envoy_binary();
    let is_script = std::fs::read(&binary)
        .map(|b| b.starts_with(b"#!"))
        .unwrap_or(false);
    if !is_script {
        return binary;
    }
    let venv = binary
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf);
    venv.and_then(|v| std::fs::read_dir(v.join("lib")).ok())
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("site-packages/envoy/_bin/envoy"))
        .find(|p| p.is_file())
        .unwrap_or(binary)
}

/// `$ADAPTIVE_HEDGE_WASM`, else `build/adaptive_hedge.wasm` (`make build`).
pub fn wasm_path() -> PathBuf {
    std::env::var_os("ADAPTIVE_HEDGE_WASM")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("build/adaptive_hedge.wasm"))
}

/// Ports this process has handed out: the kernel may give a just-released
/// port again at once, so two calls in a row could otherwise return the same
/// port (CI once saw Envoy's admin and listener ask for one port).
static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// A free port on 127.0.0.1 (bound then released), never one this process
/// handed out before.
pub fn free_port() -> u16 {
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    // hold the listeners of ports already used, so the kernel offers others
    let mut held = Vec::new();
    for _ in 0..1000 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("no free port");
        let port = listener.local_addr().expect("no local address").port();
        if handed_out.insert(port) {
            return port;
        }
        held.push(listener);
    }
    panic!("no port left that this process has not used")
}

/// A port on 127.0.0.1 that refuses connections for as long as this value
/// lives: a socket bound to it that never listens. A port merely released
/// (`free_port`) could be taken by another process mid-test, and Linux
/// may even connect a socket to itself when its source port is the target.
pub struct RefusingPort {
    fd: libc::c_int,
    pub port: u16,
}

impl RefusingPort {
    pub fn new() -> Self {
        // SAFETY: plain socket calls on a descriptor this value owns; the
        // address is a zeroed sockaddr_in of the size passed.
        unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
            assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
            let mut addr: libc::sockaddr_in = std::mem::zeroed();
            addr.sin_family = libc::AF_INET as libc::sa_family_t;
            addr.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
            let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            let bound = libc::bind(fd, std::ptr::addr_of!(addr).cast(), len);
            let mut got = len;
            let named = libc::getsockname(fd, std::ptr::addr_of_mut!(addr).cast(), &mut got);
            if bound != 0 || named != 0 {
                let error = std::io::Error::last_os_error();
                libc::close(fd);
                panic!("a refusing port: {error}");
            }
            let port = u16::from_be(addr.sin_port);
            HANDED_OUT
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(port);
            RefusingPort { fd, port }
        }
    }
}

impl Default for RefusingPort {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for RefusingPort {
    fn drop(&mut self) {
        // SAFETY: the descriptor is this value's own, closed once.
        unsafe {
            libc::close(self.fd);
        }
    }
}

pub struct EnvoyOptions {
    /// File name under `envoy-configs/`.
    pub config: String,
    /// Plugin configuration JSON (replaces the file's `value: "{}"`).
    pub plugin_config: Option<String>,
    /// Replace the upstream ports 8081, 8082, ... in order.
    pub upstream_ports: Vec<u16>,
    pub concurrency: u32,
    /// Extra textual edits (from, to), each of which must match.
    pub edits: Vec<(String, String)>,
    /// Load this module instead of `build/adaptive_hedge.wasm`.
    pub wasm: Option<PathBuf>,
    /// Pin Envoy to this CPU (cost measurements).
    pub cpu: Option<usize>,
    /// Start Envoy through this program (e.g. `func-e run`) instead of
    /// running the binary directly.
    pub launcher: Option<Launcher>,
    /// How long to wait for `/ready` (30 s; more under valgrind).
    pub ready_timeout: Duration,
}

/// A program that runs Envoy for us: `program args... -c config ...`, with
/// extra environment variables.
#[derive(Clone, Debug)]
pub struct Launcher {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

impl EnvoyOptions {
    pub fn new(config: &str, upstream_ports: &[u16]) -> Self {
        EnvoyOptions {
            config: config.to_string(),
            plugin_config: None,
            upstream_ports: upstream_ports.to_vec(),
            concurrency: 2,
            edits: Vec::new(),
            wasm: None,
            cpu: None,
            launcher: None,
            ready_timeout: Duration::from_secs(30),
        }
    }

    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout;
        self
    }

    pub fn launcher(mut self, launcher: Launcher) -> Self {
        self.launcher = Some(launcher);
        self
    }

    pub fn wasm(mut self, path: PathBuf) -> Self {
        self.wasm = Some(path);
        self
    }

    pub fn pin_to_cpu(mut self, cpu: usize) -> Self {
        self.cpu = Some(cpu);
        self
    }

    pub fn plugin_config(mut self, json: &str) -> Self {
        self.plugin_config = Some(json.to_string());
        self
    }

    pub fn concurrency(mut self, n: u32) -> Self {
        self.concurrency = n;
        self
    }

    pub fn edit(mut self, from: &str, to: &str) -> Self {
        self.edits.push((from.to_string(), to.to_string()));
        self
    }

    /// Adds the fourth upstream host (port 8084, backend-b's) to the
    /// `backend` cluster, after its third: four hosts behind `/`.
    pub fn four_backend_hosts(self) -> Self {
        let (Some(&third), Some(&fourth)) =
            (self.upstream_ports.get(2), self.upstream_ports.get(3))
        else {
            return self;
        };
        let line = |port: u16| {
            format!("- endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }} }}")
        };
        let (from, to) = (
            line(third),
            format!("{}\n              {}", line(third), line(fourth)),
        );
        self.edit(&from, &to)
    }

    /// Makes Envoy treat loopback clients as internal, so that it would obey
    /// their `x-envoy-*` retry headers if the filter did not remove them.
    pub fn trust_loopback_clients(self) -> Self {
        self.edit(
            "stat_prefix: ingress\n",
            "stat_prefix: ingress\n                use_remote_address: true\n                internal_address_config:\n                  cidr_ranges: [{ address_prefix: 127.0.0.0, prefix_len: 8 }]\n",
        )
    }
}

static INSTANCE: AtomicU32 = AtomicU32::new(0);

/// Counters and gauges of a `/stats` text.
fn parse_stats(body: &str) -> HashMap<String, i64> {
    body.lines()
        .filter_map(|l| {
            let (name, value) = l.split_once(": ")?;
            Some((name.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

pub trait ChildSetup {
    fn pre_exec_setup(&mut self, cpu: Option<usize>) -> &mut Self;
}

impl ChildSetup for Command {
    /// Before exec: asks the kernel to kill the child when the thread that
    /// started it ends (a test binary killed by a signal, or by CI's
    /// timeout, runs no destructor; its Envoys kept their ports and CPU).
    /// Every Envoy is started and stopped on one thread (a test's, or the
    /// bench's main thread), so this never fires on a live one. Pins the
    /// child to `cpu` too (Envoy's threads inherit it).
    fn pre_exec_setup(&mut self, cpu: Option<usize>) -> &mut Self {
        use std::os::unix::process::CommandExt;
        // SAFETY: getpid is always safe.
        let parent = unsafe { libc::getpid() };
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            self.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                // the parent may have died before the prctl took effect
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                if let Some(cpu) = cpu {
                    pin_current_thread(cpu);
                }
                Ok(())
            });
        }
        self
    }
}

/// Pins the calling thread (and the threads it starts afterwards) to one CPU.
pub fn pin_current_thread(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET writes within it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Pids of the Envoys this process started and has not stopped yet.
static RUNNING: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());

/// Stops every Envoy this process started (for a signal handler: destructors
/// do not run when a process exits on a signal).
pub fn kill_all() {
    if let Ok(pids) = RUNNING.lock() {
        for pid in pids.iter() {
            // SAFETY: signalling our own children by pid.
            unsafe {
                libc::kill(*pid as i32, libc::SIGTERM);
            }
        }
    }
}

/// The threads (Envoy's log's second field) that logged the filter's
/// "configured" line, among the lines `which` keeps.
fn configured_threads(log: &str, which: impl Fn(&str) -> bool) -> usize {
    log.lines()
        .filter(|l| l.contains("adaptive-hedge 0.1.0 configured") && which(l))
        .filter_map(|l| l.split("][").nth(1))
        .collect::<std::collections::BTreeSet<_>>()
        .len()
}

pub struct Envoy {
    child: Child,
    /// The config loads the filter (baseline and static-hedge ones do not).
    has_filter: bool,
    /// The config runs the module as an upstream filter too (streaming).
    has_upstream_role: bool,
    /// The config runs the module in the downstream role too (a plugin
    /// configuration without `"role": "upstream"`).
    has_downstream_role: bool,
    /// Worker threads: each, and the main thread, configures the filter.
    concurrency: u32,
    pub admin_port: u16,
    pub listener_port: u16,
    dir: PathBuf,
}

fn render(opts: &EnvoyOptions, admin: u16, listener: u16) -> Result<String, String> {
    let path = repo_root().join("envoy-configs").join(&opts.config);
    let mut text =
        std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut replace = |from: &str, to: &str| -> Result<(), String> {
        if !text.contains(from) {
            return Err(format!("{}: `{from}` not found", opts.config));
        }
        text = text.replace(from, to);
        Ok(())
    };
    replace("port_value: 9901 ", &format!("port_value: {admin} "))?;
    replace("port_value: 10000 ", &format!("port_value: {listener} "))?;
    for (i, port) in opts.upstream_ports.iter().enumerate() {
        replace(
            &format!("port_value: {} ", 8081 + i),
            &format!("port_value: {port} "),
        )?;
    }
    let wasm = opts
        .wasm
        .clone()
        .unwrap_or_else(wasm_path)
        .display()
        .to_string();
    let _ = replace("build/adaptive_hedge.wasm", &wasm); // configs without the filter have none
    if let Some(json) = &opts.plugin_config {
        let quoted = serde_json::to_string(json).map_err(|e| e.to_string())?;
        replace("value: \"{}\"", &format!("value: {quoted}"))?;
    }
    for (from, to) in &opts.edits {
        replace(from, to)?;
    }
    Ok(text)
}

impl Envoy {
    /// Starts Envoy and waits for `/ready`. The error carries Envoy's log.
    /// A port taken between choosing it and Envoy binding it (another
    /// server of the same test run) is retried on fresh ports.
    pub fn start(opts: EnvoyOptions) -> Result<Envoy, String> {
        let mut attempt = 0;
        loop {
            match Self::start_once(&opts) {
                Err(e) if attempt < 2 && e.contains("Address already in use") => attempt += 1,
                other => return other,
            }
        }
    }

    fn start_once(opts: &EnvoyOptions) -> Result<Envoy, String> {
        if opts.wasm.is_none() && !wasm_path().exists() {
            return Err(format!(
                "{} is missing: run `make build`",
                wasm_path().display()
            ));
        }
        let admin_port = free_port();
        let listener_port = free_port();
        let text = render(opts, admin_port, listener_port)?;
        let n = INSTANCE.fetch_add(1, Ordering::SeqCst);
        let dir =
            std::env::temp_dir().join(format!("adaptive-hedge-envoy-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let config_path = dir.join("envoy.yaml");
        std::fs::write(&config_path, &text).map_err(|e| e.to_string())?;
        // stderr, not --log-path: the log file is flushed lazily, stderr at once
        let log_file = std::fs::File::create(dir.join("envoy.log")).map_err(|e| e.to_string())?;
        let mut command = match &opts.launcher {
            Some(l) => {
                let mut c = Command::new(&l.program);
                c.args(&l.args).envs(l.env.iter().map(|(k, v)| (k, v)));
                c
            }
            None => Command::new(envoy_binary()),
        };
        let child = command
            .arg("-c")
            .arg(&config_path)
            .args(["--concurrency", &opts.concurrency.to_string()])
            .args([
                "--use-dynamic-base-id",
                "--disable-hot-restart",
                "--log-level",
                "info",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log_file))
            .pre_exec_setup(opts.cpu)
            .spawn()
            .map_err(|e| {
                format!(
                    "cannot run {}: {e} (run `make setup`)",
                    envoy_binary().display()
                )
            })?;
        if let Ok(mut pids) = RUNNING.lock() {
            pids.push(child.id());
        }
        // the module's file, whichever build (`.wasm(...)`: the fault
        // injection one)
        let has_filter = text
            .lines()
            .any(|l| l.contains("filename") && l.contains("adaptive_hedge"));
        let has_upstream_role = text.contains(r#"\"role\": \"upstream\""#);
        let modules = text
            .lines()
            .filter(|l| l.contains("filename") && l.contains("adaptive_hedge"))
            .count();
        let has_downstream_role = modules > text.matches(r#"\"role\": \"upstream\""#).count();
        let mut envoy = Envoy {
            child,
            has_filter,
            has_upstream_role,
            has_downstream_role,
            concurrency: opts.concurrency,
            admin_port,
            listener_port,
            dir,
        };
        let deadline = Instant::now() + opts.ready_timeout;
        loop {
            if let Ok(Some(status)) = envoy.child.try_wait() {
                return Err(format!(
                    "envoy exited ({status}) before ready:\n{}",
                    envoy.log()
                ));
            }
            if matches!(envoy.admin("/ready"), Ok((200, _))) {
                return Ok(envoy);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "envoy not ready after {:?}:\n{}",
                    opts.ready_timeout,
                    envoy.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Runs `envoy --mode validate` on a rendered config; returns (ok, output).
    pub fn validate(opts: EnvoyOptions) -> Result<(bool, String), String> {
        let text = render(&opts, 9901, 10000)?;
        let n = INSTANCE.fetch_add(1, Ordering::SeqCst);
        let path = std::env::temp_dir().join(format!(
            "adaptive-hedge-validate-{}-{n}.yaml",
            std::process::id()
        ));
        std::fs::write(&path, text).map_err(|e| e.to_string())?;
        let out = Command::new(envoy_binary())
            .args(["--mode", "validate", "--use-dynamic-base-id", "-c"])
            .arg(&path)
            .output()
            .map_err(|e| e.to_string())?;
        let _ = std::fs::remove_file(&path);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok((out.status.success(), text))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.listener_port)
    }

    /// GET on the admin port: (status, body).
    pub fn admin(&self, path: &str) -> std::io::Result<(u16, String)> {
        http_get(self.admin_port, path)
    }

    /// Counters and gauges from `/stats`.
    pub fn stats(&self) -> HashMap<String, i64> {
        let body = self.admin("/stats").map(|(_, b)| b).unwrap_or_default();
        parse_stats(&body)
    }

    /// Whether its configuration loads adaptive-hedge.
    pub fn has_filter(&self) -> bool {
        self.has_filter
    }

    /// One stat; `None` if Envoy has no such stat.
    pub fn stat(&self, name: &str) -> Option<i64> {
        self.stats().get(name).copied()
    }

    /// A filter stat: `adaptive_hedge.<metric>.<cluster>` (as shown at
    /// /stats); `None` until the filter has defined it.
    pub fn filter_stat(&self, metric: &str, cluster: &str) -> Option<i64> {
        self.stat(&filter_stat_name(metric, cluster))
    }

    /// The requests the filter has seen for `cluster`, once at least
    /// `at_least`: its `requests_total` and the worker-wide
    /// `unconfirmed_requests_total` (each worker's first requests to a
    /// cluster, before an upstream of it answered, are not the cluster's).
    /// For a test with one cluster.
    pub fn requests_seen(&self, cluster: &str, at_least: i64) -> i64 {
        let name = filter_stat_name("requests_total", cluster);
        let unconfirmed = "wasmcustom.adaptive_hedge.unconfirmed_requests_total";
        let seen = |s: &HashMap<String, i64>| {
            s.get(&name).copied().unwrap_or(0) + s.get(unconfirmed).copied().unwrap_or(0)
        };
        let stats = self.wait_for_stats(&format!("{name} + unconfirmed >= {at_least}"), |s| {
            seen(s) >= at_least
        });
        seen(&stats)
    }

    /// A filter stat once it is defined and reaches `at_least`. The filter
    /// flushes its stats on its tick (every `sync_interval`), and a loaded
    /// machine can delay a tick well past any fixed sleep. Panics with the
    /// filter's stats after 10 s.
    pub fn flushed_filter_stat(&self, metric: &str, cluster: &str, at_least: i64) -> i64 {
        let name = filter_stat_name(metric, cluster);
        let stats = self.wait_for_stats(&format!("{name} >= {at_least}"), |s| {
            s.get(&name).is_some_and(|v| *v >= at_least)
        });
        stats.get(&name).copied().unwrap_or_default()
    }

    /// The stats once `condition` holds on them; panics, naming `what` and
    /// showing the filter's stats, if it does not within 10 s.
    pub fn wait_for_stats(
        &self,
        what: &str,
        condition: impl Fn(&HashMap<String, i64>) -> bool,
    ) -> HashMap<String, i64> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let stats = self.stats();
            if condition(&stats) {
                return stats;
            }
            assert!(
                Instant::now() < deadline,
                "waited 10 s for {what}: {}",
                self.filter_stats("")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Envoy's log once it contains `needle`; panics, showing the log, if
    /// it does not within 10 s.
    pub fn wait_for_log(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let log = self.log();
            if log.contains(needle) {
                return log;
            }
            assert!(
                Instant::now() < deadline,
                "waited 10 s for {needle:?} in the log:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Envoy's log, without the start-up listing of compiled-in extensions.
    pub fn log(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("envoy.log")).unwrap_or_default();
        text.lines()
            .filter(|l| !l.contains("server.cc:467]") && !l.contains("server.cc:547]"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The log's last `lines` lines, for a report that outlives this Envoy
    /// (its directory, log included, goes when it is dropped).
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Envoy's log and wasm stats show no VM failure (a crashed filter under
    /// FAIL_OPEN would look like no filter at all), and the filter did start.
    pub fn assert_no_vm_failure(&self) {
        self.assert_no_vm_failure_except(&[]);
    }

    /// `assert_no_vm_failure`, but for the lines in `expected` (a test of
    /// the very complaint: the upstream role's hung holds).
    pub fn assert_no_vm_failure_except(&self, expected: &[&str]) {
        let log = self.log();
        // Envoy's own words for a plugin or VM that could not start on a
        // thread ("Plugin ... failed to load", "Failed to load Wasm ...",
        // "Unable to create Wasm ..."), whatever their case
        let lower = log.to_lowercase();
        for needle in ["failed to load", "unable to create wasm"] {
            if expected.contains(&needle) {
                continue;
            }
            assert!(
                !lower.contains(needle),
                "Envoy log shows a plugin that did not load ({needle}):\n{log}"
            );
        }
        for needle in [
            "panicked",
            "wasm trap",
            "Wasm VM failed",
            "Function: proxy_on",
            "Failed to load Wasm",
            "unreachable",
            // a role in the wrong filter chain (it passes requests through)
            "Requests pass through untouched",
            // the upstream role's holds never released
            "none was ever released",
        ] {
            if expected.contains(&needle) {
                continue;
            }
            assert!(
                !log.contains(needle),
                "Envoy log shows a VM failure ({needle}):\n{log}"
            );
        }
        // an admin interface that does not answer hides every stat
        let (status, body) = self
            .admin("/stats")
            .unwrap_or_else(|e| panic!("Envoy's admin /stats: {e}\n{log}"));
        let stats = parse_stats(&body);
        assert!(
            status == 200 && !stats.is_empty(),
            "Envoy's admin /stats answered {status} with no stats"
        );
        for (name, value) in stats {
            // vm_reload*: a VM that failed and was replaced (FAIL_RELOAD)
            if name.starts_with("wasm.")
                && (name.contains("vm_reload") || name.ends_with(".failed"))
            {
                assert_eq!(value, 0, "{name} = {value}");
            }
        }
        // configured on every thread: a worker whose plugin failed to
        // start passes its requests through under FAIL_OPEN, unseen by
        // the checks above
        // (each role that configured anywhere, on every thread)
        let threads = self.concurrency as usize + 1;
        if self.has_filter {
            assert!(
                log.contains("adaptive-hedge 0.1.0 configured"),
                "the filter never configured:\n{log}"
            );
            for (role, upstream) in [("downstream", false), ("upstream", true)] {
                let configured =
                    configured_threads(&log, |l| l.contains(r#""role":"upstream""#) == upstream);
                let required = if upstream {
                    self.has_upstream_role
                } else {
                    self.has_downstream_role
                };
                assert!(
                    configured >= threads || (configured == 0 && !required),
                    "the {role} role configured on {configured} of {threads} threads:\n{log}"
                );
            }
        }
    }

    /// The filter's stats of one cluster (all clusters for ""), for failure
    /// messages.
    pub fn filter_stats(&self, cluster: &str) -> String {
        let mut lines: Vec<String> = self
            .stats()
            .into_iter()
            .filter(|(k, _)| {
                k.starts_with("wasmcustom.")
                    && (cluster.is_empty()
                        || k.ends_with(&format!(".{cluster}"))
                        || !k.contains(".backend"))
            })
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        lines.sort();
        lines.join(" ")
    }

    /// CPU time Envoy has used so far, in seconds: the sum of its threads'
    /// run time in nanoseconds (`/proc/<pid>/task/*/schedstat`), or, where
    /// the kernel keeps none, user + system time in clock ticks (10 ms: at
    /// 1,000 requests a second over 4 s, 2.5 µs a request).
    pub fn cpu_seconds(&self) -> f64 {
        self.run_time_seconds()
            .unwrap_or_else(|| self.cpu_ticks_seconds())
    }

    fn run_time_seconds(&self) -> Option<f64> {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", self.child.id())).ok()?;
        let mut ns = 0u64;
        for task in tasks.flatten() {
            let stat = std::fs::read_to_string(task.path().join("schedstat")).ok()?;
            ns += stat.split_whitespace().next()?.parse::<u64>().ok()?;
        }
        // a kernel without scheduler statistics answers zeros
        (ns > 0).then_some(ns as f64 / 1e9)
    }

    fn cpu_ticks_seconds(&self) -> f64 {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        // fields after the ")" that ends the command name: utime is the 12th, stime the 13th
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, r)| r.split_whitespace().collect())
            .unwrap_or_default();
        let ticks: f64 = [11, 12]
            .iter()
            .filter_map(|&i| fields.get(i)?.parse::<f64>().ok())
            .sum();
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        ticks / hz.max(1.0)
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "----- envoy log ({}) -----\n{}\n----- end of envoy log -----",
                self.dir.display(),
                self.log()
            );
        }
        // Only a child not yet reaped is still ours: the pid of one that
        // exited early (and was waited for) may be another process's now.
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: signalling our own child by its pid, not yet reaped.
            unsafe {
                libc::kill(self.child.id() as i32, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Ok(mut pids) = RUNNING.lock() {
            pids.retain(|p| *p != self.child.id());
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// `wasmcustom.adaptive_hedge.<metric>.<cluster>`: a filter stat at /stats.
pub fn filter_stat_name(metric: &str, cluster: &str) -> String {
    format!("wasmcustom.adaptive_hedge.{metric}.{cluster}")
}

/// A minimal blocking HTTP/1.1 GET on loopback (Envoy refuses HTTP/1.0).
pub fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    Ok((
        status,
        if chunked {
            dechunk(body)
        } else {
            body.to_string()
        },
    ))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::configured_threads;

    /// Envoy's log format: `[time][thread][level][logger] [file:line] text`.
    #[test]
    fn configured_threads_counts_each_thread_once_per_role() {
        let line = |thread: u32, config: &str| {
            format!(
                "[2026-11-29 09:00:00.000][{thread}][info][wasm] [source/extensions/common/wasm/context.cc:1190] wasm log adaptive-hedge: adaptive-hedge 0.1.0 configured: {config}\n"
            )
        };
        let mut log = String::new();
        for thread in [10, 11, 11] {
            log.push_str(&line(thread, "{}"));
        }
        log.push_str(&line(12, r#"{"role":"upstream"}"#));
        let upstream = |l: &str| l.contains(r#""role":"upstream""#);
        // the downstream role on two threads of three: one worker missing
        assert_eq!(configured_threads(&log, |l| !upstream(l)), 2);
        assert_eq!(configured_threads(&log, upstream), 1);
    }
}
