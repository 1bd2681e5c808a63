//! A real Prometheus 3 server (built by scripts/install-tools.sh) on a free loopback port,
//! scraping given targets.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::process::{
    Peer, TempDir, http_get, locate_binary, poll, start_on_free_ports, tools_dir, url_encode,
};

/// How long [`Prometheus::start`] waits for `/-/ready`.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The `prometheus` binary: `$PHASETRACE_PROMETHEUS_BIN`, then `PATH`. Panics when it is
/// missing: tests guard with [`crate::require_tools!`] first.
pub fn prometheus_binary() -> PathBuf {
    find_prometheus().unwrap_or_else(|| panic!("prometheus not found: run scripts/test.sh"))
}

/// The `promtool` binary: `$PHASETRACE_PROMTOOL_BIN`, then `PATH`. Panics when it is
/// missing: tests guard with [`crate::require_tools!`] first.
pub fn promtool_binary() -> PathBuf {
    find_promtool().unwrap_or_else(|| panic!("promtool not found: run scripts/test.sh"))
}

/// Every bundled rule file, `otel-config/rules/*.yml` without the `promtool test rules` files
/// (`*.test.yml`), sorted: what `otel-config/prometheus.yml` loads and what
/// `scripts/promql-live-check.py` checks. Panics when the folder cannot be read (a test).
pub fn bundled_rule_files() -> Vec<PathBuf> {
    let dir = crate::process::repo_root()
        .join("otel-config")
        .join("rules");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            name.ends_with(".yml") && !name.ends_with(".test.yml")
        })
        .collect();
    files.sort();
    files
}

pub(crate) fn find_prometheus() -> Option<PathBuf> {
    locate_binary(
        "PHASETRACE_PROMETHEUS_BIN",
        &[tools_dir().join("bin").join("prometheus")],
        "prometheus",
    )
}

pub(crate) fn find_promtool() -> Option<PathBuf> {
    locate_binary(
        "PHASETRACE_PROMTOOL_BIN",
        &[tools_dir().join("bin").join("promtool")],
        "promtool",
    )
}

/// One exemplar as `query_exemplars` returns it: the series' labels, the exemplar's labels
/// (`trace_id`, `span_id`) and its value.
pub type SeriesExemplar = (BTreeMap<String, String>, BTreeMap<String, String>, f64);

/// What [`PrometheusBuilder::start`] runs.
#[derive(Debug, Clone)]
pub struct PrometheusBuilder {
    jobs: Vec<(String, String)>,
    scrape_interval: String,
    evaluation_interval: Option<String>,
    rule_files: Vec<PathBuf>,
    rule_texts: Vec<(String, String)>,
    extra_args: Vec<String>,
    data_dir: Option<PathBuf>,
    /// Scrape jobs given as YAML (TLS, basic auth, ...), each its own list item.
    raw_jobs: Vec<String>,
    /// An existing configuration file to run instead of the one this builder writes.
    config_file: Option<PathBuf>,
}

impl PrometheusBuilder {
    /// Adds a scrape job written out in full: the YAML of one `scrape_configs` item without
    /// its leading `- ` (`job_name: x\nscheme: https\n...`), indented by this builder.
    pub fn raw_job(mut self, yaml: &str) -> Self {
        self.raw_jobs.push(yaml.to_string());
        self
    }

    /// Adds a scrape job. `target` is `host:port`, optionally with a path
    /// (`127.0.0.1:9464/metrics`) and an `http://` prefix; the default path is `/metrics`.
    /// Calling it again with the same job name adds a target to that job.
    pub fn job(mut self, job_name: &str, target: &str) -> Self {
        self.jobs.push((job_name.to_string(), target.to_string()));
        self
    }

    /// Adds scrape jobs named `target-0`, `target-1`, ... (continuing the numbering).
    pub fn targets(mut self, targets: &[String]) -> Self {
        for target in targets {
            let name = format!("target-{}", self.jobs.len());
            self.jobs.push((name, target.clone()));
        }
        self
    }

    /// Scrape interval, a Prometheus duration such as `"1s"` or `"500ms"`. Also the rule
    /// evaluation interval unless [`PrometheusBuilder::evaluation_interval`] is set.
    pub fn scrape_interval(mut self, interval: &str) -> Self {
        self.scrape_interval = interval.to_string();
        self
    }

    pub fn evaluation_interval(mut self, interval: &str) -> Self {
        self.evaluation_interval = Some(interval.to_string());
        self
    }

    /// Loads an existing rule file (recording or alerting rules), e.g. one from the repo.
    pub fn rule_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.rule_files.push(path.into());
        self
    }

    /// Loads every bundled rule file ([`bundled_rule_files`]), as the bundled
    /// `otel-config/prometheus.yml` does.
    pub fn bundled_rules(mut self) -> Self {
        self.rule_files.extend(bundled_rule_files());
        self
    }

    /// Writes `contents` as rule file `file_name` into the server's temp dir and loads it.
    pub fn rule_text(mut self, file_name: &str, contents: &str) -> Self {
        self.rule_texts
            .push((file_name.to_string(), contents.to_string()));
        self
    }

    /// An extra command-line flag, e.g. `--web.enable-remote-write-receiver`.
    /// Serves an existing TSDB directory (a backfill) instead of a fresh one.
    pub fn data_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.data_dir = Some(dir.into());
        self
    }

    /// Runs an existing configuration file (e.g. one of `otel-config/`) unchanged instead of
    /// the one this builder writes; the builder's jobs, rules and intervals are then unused.
    pub fn config_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.config_file = Some(path.into());
        self
    }

    pub fn arg(mut self, arg: &str) -> Self {
        self.extra_args.push(arg.to_string());
        self
    }

    /// The configuration file this builder writes, given the paths of its rule files.
    pub fn config_yaml(&self, rule_paths: &[PathBuf]) -> String {
        let evaluation = self
            .evaluation_interval
            .as_deref()
            .unwrap_or(&self.scrape_interval);
        let mut yaml = format!(
            "global:\n  scrape_interval: {}\n  scrape_timeout: {}\n  evaluation_interval: {}\n",
            self.scrape_interval, self.scrape_interval, evaluation
        );
        if !rule_paths.is_empty() {
            yaml.push_str("rule_files:\n");
            for path in rule_paths {
                yaml.push_str(&format!(
                    "  - {}\n",
                    yaml_quote(&path.display().to_string())
                ));
            }
        }
        yaml.push_str("scrape_configs:\n");
        // Targets added under one job name share one scrape job (and so one `job` label).
        let mut merged: Vec<(&str, &str, Vec<&str>)> = Vec::new();
        for (job, target) in &self.jobs {
            let target = target.strip_prefix("http://").unwrap_or(target);
            let (address, path) = match target.find('/') {
                Some(i) => (&target[..i], &target[i..]),
                None => (target, "/metrics"),
            };
            match merged.iter_mut().find(|(j, _, _)| *j == job.as_str()) {
                Some((_, p, targets)) => {
                    assert_eq!(*p, path, "job {job}: one metrics path per job");
                    targets.push(address);
                }
                None => merged.push((job.as_str(), path, vec![address])),
            }
        }
        for (job, path, targets) in merged {
            let targets: Vec<String> = targets.into_iter().map(yaml_quote).collect();
            yaml.push_str(&format!(
                "  - job_name: {}\n    metrics_path: {}\n    static_configs:\n      - targets: [{}]\n",
                yaml_quote(job),
                yaml_quote(path),
                targets.join(", ")
            ));
        }
        for raw in &self.raw_jobs {
            for (i, line) in raw.lines().enumerate() {
                let lead = if i == 0 { "  - " } else { "    " };
                yaml.push_str(&format!("{lead}{line}\n"));
            }
        }
        if self.jobs.is_empty() && self.raw_jobs.is_empty() {
            // Prometheus accepts an empty list; keep the key for readability.
            yaml.push_str("  []\n");
        }
        yaml
    }

    /// Writes the config and rule files, starts Prometheus and waits until it is ready.
    pub fn start(self) -> Prometheus {
        let bin = prometheus_binary();
        let dir = TempDir::new("phasetrace-prometheus");
        let mut rule_paths = self.rule_files.clone();
        for (name, text) in &self.rule_texts {
            let path = dir.path().join(name);
            std::fs::write(&path, text)
                .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
            rule_paths.push(path);
        }
        let config_path = match &self.config_file {
            Some(path) => path.clone(),
            None => {
                let path = dir.path().join("prometheus.yml");
                std::fs::write(&path, self.config_yaml(&rule_paths))
                    .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
                path
            }
        };

        let (data_dir, extra_args) = (&self.data_dir, &self.extra_args);
        let ([port], peer) = start_on_free_ports(
            "prometheus",
            START_TIMEOUT,
            |&[port]: &[u16; 1]| {
                let data_dir = data_dir
                    .clone()
                    .unwrap_or_else(|| dir.path().join(format!("data-{port}")));
                let mut command = Command::new(&bin);
                command
                    .arg(format!("--config.file={}", config_path.display()))
                    .arg(format!("--storage.tsdb.path={}", data_dir.display()))
                    .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                    .arg("--log.level=info")
                    .args(extra_args);
                command
            },
            |&[port]| {
                matches!(
                    http_get(&format!("http://127.0.0.1:{port}/-/ready")),
                    Ok((200, _))
                )
            },
        );
        Prometheus {
            base_url: format!("http://127.0.0.1:{port}"),
            job_count: self.jobs.len() + self.raw_jobs.len(),
            config_path,
            peer,
            _dir: dir,
        }
    }
}

fn yaml_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// A running Prometheus with its own temp dir (config, rules, TSDB), killed on drop.
pub struct Prometheus {
    base_url: String,
    job_count: usize,
    config_path: PathBuf,
    peer: Peer,
    _dir: TempDir,
}

impl Prometheus {
    pub fn builder() -> PrometheusBuilder {
        PrometheusBuilder {
            jobs: Vec::new(),
            scrape_interval: "1s".to_string(),
            evaluation_interval: None,
            rule_files: Vec::new(),
            rule_texts: Vec::new(),
            extra_args: Vec::new(),
            data_dir: None,
            raw_jobs: Vec::new(),
            config_file: None,
        }
    }

    /// Scrapes each of `scrape_targets` (`host:port[/path]`) as jobs `target-0`, `target-1`, ...
    /// every `scrape_interval` (e.g. `"1s"`).
    pub fn start(scrape_targets: &[String], scrape_interval: &str) -> Prometheus {
        Prometheus::builder()
            .targets(scrape_targets)
            .scrape_interval(scrape_interval)
            .start()
    }

    /// Like [`Prometheus::start`], also loading the given rule files.
    pub fn start_with_rules(
        scrape_targets: &[String],
        scrape_interval: &str,
        rule_files: &[PathBuf],
    ) -> Prometheus {
        rule_files
            .iter()
            .fold(
                Prometheus::builder()
                    .targets(scrape_targets)
                    .scrape_interval(scrape_interval),
                |builder, path| builder.rule_file(path),
            )
            .start()
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    /// Prometheus' log so far.
    pub fn output(&self) -> String {
        self.peer.output()
    }

    /// `GET path` on this server (path starts with `/`), the body parsed as JSON.
    pub fn get_json(&self, path_and_query: &str) -> Result<serde_json::Value, String> {
        let url = format!("{}{path_and_query}", self.base_url);
        let (status, body) = http_get(&url)?;
        let json: serde_json::Value = serde_json::from_str(&body)
            .map_err(|e| format!("GET {url}: status {status}, body is not JSON ({e}): {body}"))?;
        if status != 200 {
            return Err(format!("GET {url}: status {status}: {body}"));
        }
        Ok(json)
    }

    /// Instant query; the whole API response (`{"status":"success","data":{...}}`).
    /// Panics when the request fails or Prometheus reports an error.
    pub fn query(&self, promql: &str) -> serde_json::Value {
        self.try_query(promql)
            .unwrap_or_else(|e| panic!("query {promql:?} failed: {e}"))
    }

    pub fn try_query(&self, promql: &str) -> Result<serde_json::Value, String> {
        let json = self.get_json(&format!("/api/v1/query?query={}", url_encode(promql)))?;
        if json["status"] != "success" {
            return Err(format!("query {promql:?}: {json}"));
        }
        Ok(json)
    }

    /// The samples of an instant query: one `(labels, value)` per series of a vector result,
    /// or a single entry with no labels for a scalar result.
    pub fn query_vector(&self, promql: &str) -> Vec<(BTreeMap<String, String>, f64)> {
        samples(&self.query(promql))
    }

    /// The value of a query expected to give a scalar or a single-series vector; `None`
    /// for an empty result. Panics when there are several series.
    pub fn query_scalar(&self, promql: &str) -> Option<f64> {
        let samples = self.query_vector(promql);
        assert!(
            samples.len() <= 1,
            "query {promql:?} returned {} series, expected at most one: {samples:?}",
            samples.len()
        );
        samples.into_iter().next().map(|(_, value)| value)
    }

    /// Polls `promql` every 100 ms until `done` accepts its samples, and returns them.
    /// Panics after `timeout` with the last result and Prometheus' log.
    pub fn wait_for_query(
        &self,
        promql: &str,
        mut done: impl FnMut(&[(BTreeMap<String, String>, f64)]) -> bool,
        timeout: Duration,
    ) -> Vec<(BTreeMap<String, String>, f64)> {
        let mut last = String::new();
        let found = poll(timeout, || match self.try_query(promql) {
            Ok(json) => {
                let got = samples(&json);
                if done(&got) {
                    Some(got)
                } else {
                    last = format!("{got:?}");
                    None
                }
            }
            Err(e) => {
                last = e;
                None
            }
        });
        found.unwrap_or_else(|| {
            panic!(
                "query {promql:?} did not give the expected result within {timeout:?}; last: {last}\nprometheus log:\n{}",
                self.output()
            )
        })
    }

    /// Waits until every configured target has been scraped successfully (`up == 1`).
    pub fn wait_for_up(&self, timeout: Duration) {
        let expected = self.job_count;
        self.wait_for_query(
            "up",
            |samples| samples.len() == expected && samples.iter().all(|(_, v)| *v == 1.0),
            timeout,
        );
    }

    /// The scrape targets as `/api/v1/targets` reports them.
    pub fn targets(&self) -> serde_json::Value {
        self.get_json("/api/v1/targets")
            .unwrap_or_else(|e| panic!("listing targets: {e}"))
    }

    /// Every exemplar of the series `query` selects, from `within` ago to now:
    /// `(series labels, exemplar labels, value)` (`/api/v1/query_exemplars`). Empty when
    /// there are none or the request fails.
    pub fn exemplars(&self, query: &str, within: Duration) -> Vec<SeriesExemplar> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        let path = format!(
            "/api/v1/query_exemplars?query={}&start={}&end={}",
            url_encode(query),
            now - within.as_secs_f64(),
            now + 60.0
        );
        let Ok(json) = self.get_json(&path) else {
            return Vec::new();
        };
        let labels = |v: &serde_json::Value| -> BTreeMap<String, String> {
            v.as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                        .collect()
                })
                .unwrap_or_default()
        };
        let mut out = Vec::new();
        for series in json["data"].as_array().into_iter().flatten() {
            for exemplar in series["exemplars"].as_array().into_iter().flatten() {
                let value = exemplar["value"]
                    .as_str()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(f64::NAN);
                out.push((
                    labels(&series["seriesLabels"]),
                    labels(&exemplar["labels"]),
                    value,
                ));
            }
        }
        out
    }

    /// The loaded rule groups as `/api/v1/rules` reports them.
    pub fn rules(&self) -> serde_json::Value {
        self.get_json("/api/v1/rules")
            .unwrap_or_else(|e| panic!("listing rules: {e}"))
    }
}

/// `(labels, value)` pairs of a query response's vector or scalar result.
pub fn samples(response: &serde_json::Value) -> Vec<(BTreeMap<String, String>, f64)> {
    let data = &response["data"];
    let parse_value = |pair: &serde_json::Value| -> f64 {
        pair.get(1)
            .and_then(|v| v.as_str())
            .and_then(|s| match s {
                "+Inf" => Some(f64::INFINITY),
                "-Inf" => Some(f64::NEG_INFINITY),
                "NaN" => Some(f64::NAN),
                other => other.parse().ok(),
            })
            .unwrap_or(f64::NAN)
    };
    match data["resultType"].as_str() {
        Some("vector") => data["result"]
            .as_array()
            .map(|series| {
                series
                    .iter()
                    .map(|s| {
                        let labels = s["metric"]
                            .as_object()
                            .map(|m| {
                                m.iter()
                                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                                    .collect()
                            })
                            .unwrap_or_default();
                        (labels, parse_value(&s["value"]))
                    })
                    .collect()
            })
            .unwrap_or_default(),
        Some("scalar") => vec![(BTreeMap::new(), parse_value(&data["result"]))],
        other => panic!("unsupported result type {other:?} in {response}"),
    }
}
