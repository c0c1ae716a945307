//! `shardlog bench` as a user runs it: the real binary spawning its own
//! broker (or against one started here), checked through the files it
//! writes (JSON, SVG, .hgrm) and the broker's metrics.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

fn bench(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_shardlog")).arg("bench").args(args).output().expect("run shardlog bench")
}

fn succeed(args: &[&str]) -> String {
    let output = bench(args);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "shardlog bench {args:?} failed: {}\nstdout:\n{stdout}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

fn json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("json written")).expect("valid JSON")
}

fn number(value: &Value, pointer: &str) -> f64 {
    value.pointer(pointer).and_then(Value::as_f64).unwrap_or_else(|| panic!("{pointer} missing in {value:#}"))
}

#[test]
fn e2e_with_verify_writes_consistent_json_svg_and_hgrm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    let (json_path, svg_path, hgrm_path) = (path("run.json"), path("run.svg"), path("run.hgrm"));
    let stdout = succeed(&[
        "e2e",
        "--spawn",
        "--broker-cores",
        "1",
        "--cores",
        "1",
        "--messages",
        "20000",
        "--verify",
        "--json",
        &json_path,
        "--plot",
        &svg_path,
        "--hgrm",
        &hgrm_path,
    ]);
    assert!(stdout.contains("end-to-end") && stdout.contains("verify:"), "table printed:\n{stdout}");

    let report = json(Path::new(&json_path));
    assert!(number(&report, "/produce/msgs_per_s") > 0.0);
    assert!(number(&report, "/produce/mb_per_s") > 0.0);
    assert_eq!(number(&report, "/produce/messages"), 20000.0);
    assert_eq!(number(&report, "/consume/messages"), 20000.0);
    for field in ["expected", "received"] {
        assert_eq!(number(&report, &format!("/verify/{field}")), 20000.0, "{field}");
    }
    for field in ["lost", "duplicated", "reordered"] {
        assert_eq!(number(&report, &format!("/verify/{field}")), 0.0, "{field}");
    }
    assert_eq!(number(&report, "/latency_us/produce/count"), 20000.0);
    assert_eq!(number(&report, "/latency_us/e2e/count"), 20000.0);
    assert!(number(&report, "/latency_us/e2e/p99_us") >= number(&report, "/latency_us/e2e/p50_us"));
    assert!(number(&report, "/machine/cores") >= 1.0);
    assert!(report.pointer("/machine/kernel").and_then(Value::as_str).is_some_and(|k| !k.is_empty()));
    assert!(number(&report, "/broker/cpu_s") > 0.0, "broker CPU measured: {report:#}");
    assert!(number(&report, "/broker/bytes_per_cpu_s") > 0.0);
    assert_eq!(report.pointer("/broker/huge_pages"), Some(&Value::Bool(false)), "huge pages off by default");
    // The generator's own CPU over the same window, one core of it.
    assert_eq!(number(&report, "/generator/cores"), 1.0);
    assert!(number(&report, "/generator/cpu_s") > 0.0, "generator CPU measured: {report:#}");
    assert!(number(&report, "/generator/window_s") > 0.0);
    assert!(stdout.contains("generator: ") && stdout.contains("busy"), "generator line printed:\n{stdout}");

    check_svg(&std::fs::read_to_string(&svg_path).expect("svg written"));
    check_hgrm(&std::fs::read_to_string(&hgrm_path).expect("hgrm written"), 20000);
    let e2e_hgrm = dir.path().join("run.e2e.hgrm");
    check_hgrm(&std::fs::read_to_string(e2e_hgrm).expect("e2e hgrm written"), 20000);
}

#[test]
fn huge_pages_reach_the_spawned_broker() {
    let dir = tempfile::tempdir().expect("tempdir");
    let json_path = dir.path().join("huge.json").to_string_lossy().into_owned();
    let flags = "produce --spawn --broker-cores 1 --cores 1 --messages 2000 --huge-pages true --json";
    let stdout = succeed(&flags.split(' ').chain([json_path.as_str()]).collect::<Vec<_>>());
    let report = json(Path::new(&json_path));
    assert_eq!(report.pointer("/broker/huge_pages"), Some(&Value::Bool(true)), "{report:#}");
    assert!(stdout.contains(", huge pages"), "the broker line says so:\n{stdout}");
}

#[test]
fn fixed_rate_run_stays_within_ten_percent_of_its_target() {
    let dir = tempfile::tempdir().expect("tempdir");
    let json_path = dir.path().join("rate.json").to_string_lossy().into_owned();
    let target = 4000.0;
    succeed(&[
        "produce",
        "--spawn",
        "--broker-cores",
        "1",
        "--cores",
        "1",
        "--rate",
        "4000",
        "--duration",
        "3s",
        "--warmup",
        "1s",
        "--json",
        &json_path,
    ]);
    let report = json(Path::new(&json_path));
    let measured = number(&report, "/produce/msgs_per_s");
    assert!((measured - target).abs() <= target * 0.1, "measured {measured} msgs/s against a target of {target}");
    assert_eq!(number(&report, "/workload/rate_msgs_per_s"), target);
    // 4,000 small messages a second leave the generator's core mostly idle.
    let busy = number(&report, "/generator/busy");
    assert!(busy > 0.0 && busy < 0.5, "generator busy {busy} at a light fixed rate: {report:#}");
    let window = number(&report, "/generator/window_s");
    assert!((2.5..10.0).contains(&window), "the measured window (3 s) is what the busy share is of: {window}");
}

#[test]
fn unsupported_compression_is_refused_before_anything_starts() {
    let output = bench(&["--compression", "zstd"]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("only none"));
}

/// Well-formed enough for a browser: one root, balanced elements we draw,
/// one line per series and the legend names.
fn check_svg(svg: &str) {
    let svg = svg.trim();
    assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"), "svg root");
    assert_eq!(svg.matches("<svg").count(), 1);
    assert_eq!(svg.matches("<text").count(), svg.matches("</text>").count(), "text elements balanced");
    assert!(svg.matches("<polyline").count() >= 2, "a line per series");
    assert!(svg.contains("produce") && svg.contains("end-to-end"), "legend");
    assert!(svg.contains("99.9%"), "percentile axis labels");
    let opens = svg.matches('<').count();
    let closes = svg.matches('>').count();
    assert_eq!(opens, closes, "every tag closed");
}

/// The HdrHistogram percentile distribution: header, rows with rising
/// percentiles and counts up to the total, and the summary footer.
fn check_hgrm(text: &str, total: u64) {
    let mut lines = text.lines();
    let header = lines.next().expect("header");
    for column in ["Value", "Percentile", "TotalCount", "1/(1-Percentile)"] {
        assert!(header.contains(column), "header has {column}: {header}");
    }
    assert_eq!(lines.next(), Some(""), "blank line after the header");
    let (mut last_percentile, mut last_count, mut rows) = (-1.0f64, 0u64, 0);
    let mut footer = Vec::new();
    for line in lines {
        if line.starts_with('#') {
            footer.push(line);
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert!(fields.len() == 4 || fields.len() == 3, "row: {line}");
        let value: f64 = fields[0].parse().expect("value");
        let percentile: f64 = fields[1].parse().expect("percentile");
        let count: u64 = fields[2].parse().expect("count");
        assert!(value >= 0.0 && (0.0..=1.0).contains(&percentile));
        assert!(percentile >= last_percentile && count >= last_count, "rows rise: {line}");
        (last_percentile, last_count, rows) = (percentile, count, rows + 1);
    }
    assert!(rows > 10, "{rows} rows");
    assert_eq!(last_percentile, 1.0);
    assert_eq!(last_count, total);
    assert_eq!(footer.len(), 3, "footer: {footer:?}");
    assert!(footer[0].starts_with("#[Mean"));
    assert!(footer[1].contains(&format!("Total count    = {total:>12}")), "{}", footer[1]);
}

/// Fetch requests by session kind, summed over cores, from `/metrics`.
fn fetch_kinds(metrics_port: u16) -> (f64, f64, f64) {
    let (code, body) =
        shardlog::client::status::http_get(&format!("127.0.0.1:{metrics_port}"), "/metrics", Duration::from_secs(10))
            .expect("scrape");
    assert_eq!(code, 200, "{body}");
    let count = |kind: &str| -> f64 {
        body.lines()
            .filter(|l| {
                l.starts_with("shardlog_fetch_requests_by_session_total{") && l.contains(&format!("kind=\"{kind}\""))
            })
            .map(|l| l.rsplit_once(' ').expect("sample").1.parse::<f64>().expect("value"))
            .sum()
    };
    (count("sessionless"), count("full"), count("incremental"))
}

#[test]
fn bench_consumers_fetch_through_a_session_unless_told_not_to() {
    let metrics_port = common::free_ports(1);
    let broker = common::Broker::start(1, &["--metrics-port", &metrics_port.to_string()]);
    let brokers = broker.bootstrap();
    let run = |topic: &str, sessions: &str| {
        succeed(&[
            "e2e",
            "--brokers",
            &brokers,
            "--topic",
            topic,
            "--partitions",
            "50",
            "--rate",
            "2000",
            "--duration",
            "2s",
            "--warmup",
            "0s",
            "--verify",
            "--fetch-sessions",
            sessions,
        ]);
    };
    run("with-sessions", "true");
    let (sessionless, full, incremental) = fetch_kinds(metrics_port);
    assert!(incremental >= 10.0 && full >= 1.0, "full {full}, incremental {incremental}");
    assert_eq!(sessionless, 0.0);
    run("without-sessions", "false");
    let after = fetch_kinds(metrics_port);
    assert!(after.0 >= 10.0, "sessionless fetches: {after:?}");
    assert_eq!((after.1, after.2), (full, incremental), "no session use with --fetch-sessions false");
}
