"""The one benchmark table: the docs' and the README's figures are what ``benchmarks/table.py`` computes from every
run in the results files (never typed by hand), with the ratio fastest against fastest beside the median."""

from __future__ import annotations

import importlib.util
import json
import re
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def load_table():
    spec = importlib.util.spec_from_file_location("bench_table", ROOT / "benchmarks" / "table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


table = load_table()


def test_the_docs_and_the_readme_show_the_results_files_figures():
    assert table.main(["--check"]) == 0  # else: python benchmarks/table.py, and commit the files it rewrote
    docs, readme = (ROOT / "docs" / "benchmarks.md").read_text(), (ROOT / "README.md").read_text()
    for row in table.ROWS:  # each row's median, recomputed here from the file's runs, is in the docs' table
        values = counted_runs(ROOT / "benchmarks" / "results" / row.results, row.variant, row.metric)
        assert values, row
        median = table.fmt(statistics.median(values), row.metric, max(values))
        assert f"| {median} {table.unit(row.metric)} (" in docs, row
        if row.readme:
            assert f"| {row.readme} | {median} " in readme, row


def counted_runs(path: Path, variant: str, metric: str) -> list[float]:
    """The runs of a results file, read here independently of benchmarks/table.py: the JSON's, or a B2 report's
    "Every run" table (variant, run, wall s, fit s, ...)."""
    if path.suffix == ".md":
        column = {"wall s": 2, "fit s": 3}[metric]
        every = re.findall(r"^\| (\w+) \| run \d+ \| ([\d.]+) \| ([\d.]+) \|", path.read_text(), flags=re.M)
        return [float(cells[column - 1]) for cells in every if cells[0] == variant]
    doc = json.loads(path.read_text())
    out = []
    for r in doc["runs"]:
        if r["variant"] != variant or r["run"] == "warm-up":
            continue
        m = r["metrics"]
        if metric == "cpu ms/step":
            out.append(1000 * m["cpu s"] / m["steps"])
        elif metric in m:  # B3's runs are cold or warm
            out.append(m[metric])
    return out


def test_ratios_are_median_against_median_and_fastest_against_fastest(tmp_path):
    doc = {"date": "2026-11-27 08:00 UTC", "runs": [
        {"variant": "mine", "run": "warm-up", "metrics": {"fit s": 99.0}},  # not counted
        {"variant": "mine", "run": "run 1", "metrics": {"fit s": 20.0}},
        {"variant": "ref", "run": "run 1", "metrics": {"fit s": 15.0}},
        {"variant": "mine", "run": "run 2", "metrics": {"fit s": 16.0}},
        {"variant": "ref", "run": "run 2", "metrics": {"fit s": 30.0}},
        {"variant": "mine", "run": "run 3", "metrics": {"fit s": 18.0}},
        {"variant": "ref", "run": "run 3", "metrics": {"fit s": 16.0}}]}
    (tmp_path / "x.json").write_text(json.dumps(doc))
    row = table.Row("B2 fit", "x.json", "mine", "fit s", "ref", "native")
    f = table.figures(row, str(tmp_path))
    assert f.values == [20.0, 16.0, 18.0] and f.median == 18.0 and f.best == 16.0
    assert f.ratio_median == pytest.approx(18.0 / 16.0) and f.ratio_fastest == pytest.approx(16.0 / 15.0)
    rate = table.Row("B1", "x.json", "mine", "fit s", None, "")
    assert table.figures(rate, str(tmp_path)).ratio_median is None
    with pytest.raises(ValueError, match="no counted run of 'other'"):
        table.figures(table.Row("B1", "x.json", "other", "fit s", None, ""), str(tmp_path))


def test_a_reference_of_several_variants_is_their_sum_round_by_round(tmp_path):
    """Training alone plus Spark alone reading the rows: run i of one plus run i of the other, then median and
    fastest of those sums (not the sum of two medians)."""
    doc = {"date": "2026-11-27 08:00 UTC", "runs": [
        {"variant": "read", "run": "warm-up", "metrics": {"cpu s": 50.0, "steps": 10}},
        {"variant": "mine", "run": "run 1", "metrics": {"cpu s": 0.30, "steps": 10}},
        {"variant": "native", "run": "run 1", "metrics": {"cpu s": 0.20, "steps": 10}},
        {"variant": "read", "run": "run 1", "metrics": {"cpu s": 0.06, "steps": 10}},
        {"variant": "mine", "run": "run 2", "metrics": {"cpu s": 0.28, "steps": 10}},
        {"variant": "native", "run": "run 2", "metrics": {"cpu s": 0.25, "steps": 10}},
        {"variant": "read", "run": "run 2", "metrics": {"cpu s": 0.01, "steps": 10}}]}
    (tmp_path / "x.json").write_text(json.dumps(doc))
    f = table.figures(table.Row("B2 CPU", "x.json", "mine", "cpu ms/step", ("native", "read"), "both"), str(tmp_path))
    assert f.n_ref == 2  # 26 and 26 ms a step: the warm-up not counted
    assert f.ratio_fastest == pytest.approx(28.0 / 26.0) and f.ratio_median == pytest.approx(29.0 / 26.0)


def test_a_stale_figure_is_caught(tmp_path, monkeypatch):
    doc = {"date": "2026-11-27 08:00 UTC", "runs": [{"variant": v, "run": "run 1", "metrics": {"s": t}}
                                                     for v, t in (("nb", 0.8), ("tfos", 11.2))]}
    (tmp_path / "x.json").write_text(json.dumps(doc))
    monkeypatch.setattr(table, "RESULTS", str(tmp_path))
    monkeypatch.setattr(table, "ROWS", (table.Row("B4a", "x.json", "nb", "s", "tfos", "TFoS", readme="start"),))
    docs = tmp_path / "benchmarks.md"
    start, end = table.DOCS_MARKERS
    docs.write_text(f"# Benchmarks\n\n{start}\n| B1 | 1.23 s |\n{end}\n\nprose\n")
    monkeypatch.setattr(table, "DOCS", str(docs))
    readme = tmp_path / "README.md"
    readme.write_text((ROOT / "README.md").read_text())
    monkeypatch.setattr(table, "README", str(readme))
    assert table.main(["--check"]) == 1
    assert table.main([]) == 0
    text = docs.read_text()
    assert "1.23 s" not in text and text.startswith("# Benchmarks\n\n") and text.endswith(f"{end}\n\nprose\n")
    assert "| B4a | 0.80 s | 0.80 s (0.80–0.80) | TFoS | 0.07× | 0.07× |" in text
    assert "| start | 0.80 s (0.80) | 0.07×, 0.07× | TFoS |" in readme.read_text()
    assert table.main(["--check"]) == 0


def test_the_scale_table_shows_each_size_as_measured():
    """B6's rows on the Benchmarks page are the results file's, recomputed here: each size's nodes, run() and
    shutdown() times, as formatted there."""
    doc = json.loads((ROOT / "benchmarks" / "results" / table.SCALE_FILE).read_text())
    docs = (ROOT / "docs" / "benchmarks.md").read_text()
    assert len(doc["runs"]) >= 4  # 64 to 512 nodes
    for r in doc["runs"]:
        m = r["metrics"]
        assert f"| {m['nodes']:.0f} | {m['run s']:.2f} | {m['driver cpu %']:.1f} | " in docs, r
        assert f" | {m['shutdown s']:.2f} | {m['failure named s']:.2f} | {m['failure raised s']:.2f} |" in docs, r


def test_the_scale_figures_in_the_prose_are_the_measured_ones():
    """The architecture page's and the notebooks guide's B6 figures (CPU at 512 and 1,024 nodes, the cell's kernel,
    MLflow's calls, a panel update's size) are the results files', rounded as written; the cell's table is its file's."""
    scale = {r["metrics"]["nodes"]: r["metrics"] for r in
             json.loads((ROOT / "benchmarks" / "results" / table.SCALE_FILE).read_text())["runs"]}
    cell = json.loads((ROOT / "benchmarks" / "results" / table.CELL_FILE).read_text())["runs"][0]["metrics"]
    arch = " ".join((ROOT / "docs" / "architecture.md").read_text().split())
    guide = " ".join((ROOT / "docs" / "notebooks.md").read_text().split())
    docs = (ROOT / "docs" / "benchmarks.md").read_text()
    assert f"At 512 nodes the driver uses about {scale[512]['driver cpu %']:.0f} %" in arch
    assert f"about {cell['kernel cpu %']:.0f} %; at 1,024 the driver uses {scale[1024]['driver cpu %']:.0f} %" in arch
    assert f"in batches of 1,000 metrics: {scale[1024]['mlflow calls']:.0f} calls for 1,024 nodes" in arch
    assert f"At 512 nodes an update is about {cell['largest update kB']:.0f} kB" in guide
    assert f"about {round(scale[512]['assignments/s'], -3):,.0f} a second at 512 nodes" in arch
    assert f"about {round(scale[1024]['history MB'], -2):.0f} MB at 1,024 nodes" in arch
    assert f"of 1,024 near {round(scale[1024]['history MB'], -2):.0f} MB" in guide
    assert f"near {round(scale[512]['history MB'], -1):.0f} MB" in guide
    assert f"| {cell['nodes']:.0f} | {cell['kernel cpu %']:.1f} | {cell['panel updates/s']:.1f} | {cell['panel kB/s']:.1f} |" in docs


def test_the_cpu_table_shows_each_groups_cpu_a_step_and_the_feeds_a_1000_rows_as_the_runs_measured():
    """B2's CPU table (the deciding figure of the training benchmark): every cell recomputed here from the runs."""
    doc = json.loads((ROOT / "benchmarks" / "results" / "b2-latest.json").read_text())
    docs = (ROOT / "docs" / "benchmarks.md").read_text()
    batch = int(re.search(r"global batch (\d+)", doc["setting"]).group(1))
    for variant, words in table.CPU_VARIANTS:
        ms = [{k: 1000.0 * v / r["metrics"]["steps"] for k, v in r["metrics"].items() if k.startswith("cpu ")}
              for r in doc["runs"] if r["variant"] == variant and r["run"] != "warm-up"]
        assert len(ms) == 5, variant
        cells = [statistics.median(m[f"cpu {g} s"] for m in ms) for g in ("nodes", "feeders", "JVMs", "driver")]
        cells.append(statistics.median(m["cpu s"] for m in ms))
        cells.append(statistics.median((m["cpu feeders s"] + m["cpu JVMs s"]) * 1000 / batch for m in ms))
        assert f"| {words} | " + " | ".join(f"{c:.1f}" for c in cells) + " |" in docs, (variant, cells)


def test_the_hub_table_shows_b7s_runs():
    """B7's table on the Benchmarks page (typed from its report, not built by table.py) is the results file's: each
    row's runs in order, median (min–max), and its ratio to alice alone, recomputed here from ``b7-hub.json``."""
    runs = json.loads((ROOT / "benchmarks" / "results" / "b7-hub.json").read_text())["runs"]
    docs = (ROOT / "docs" / "benchmarks.md").read_text()

    def counted(variant: str, metric: str) -> list[float]:
        return [r["metrics"][metric] for r in runs if r["variant"] == variant and r["run"] != "warm-up"]

    def shown(values: list[float], unit: str) -> str:
        median = statistics.median(values)
        return (f"{' · '.join(f'{v:.2f}' for v in values)} {unit} | {median:.2f} {unit} "
                f"({min(values):.2f}–{max(values):.2f})")

    for label, variant, metric, unit, versus in [
            ("alice's training cell, alone: wall", "alone", "wall s", "s", None),
            ("alice's, both at once: wall", "together-alice", "wall s", "s", ("alone", "alice alone")),
            ("bob's, both at once: wall", "together-bob", "wall s", "s", ("alone", "alice alone")),
            ("alice's, alone: `model.fit`", "alone", "fit s", "s", None),
            ("alice's, both at once: `model.fit`", "together-alice", "fit s", "s", ("alone", "alice alone")),
            ("bob's, both at once: `model.fit`", "together-bob", "fit s", "s", ("alone", "alice alone")),
            ("a display update through the hub's proxy: median latency", "proxy", "median ms", "ms", ("direct", None)),
            ("the same, p95", "proxy", "p95 ms", "ms", ("direct", None))]:
        values = counted(variant, metric)
        assert len(values) == 3, (variant, metric)
        row = f"| {label} | {shown(values, unit)} |"
        assert row in docs, row
        if versus is not None:
            ratio = statistics.median(values) / statistics.median(counted(versus[0], metric))
            line = next(line for line in docs.splitlines() if line.startswith(row))
            assert f"| {ratio:.2f}×" in line, (line, ratio)
            if versus[0] == "direct":  # the reference's own figures are in the row too
                ref = counted("direct", metric)
                assert f"{statistics.median(ref):.2f} ms ({min(ref):.2f}–{max(ref):.2f})" in line, line


def test_the_partition_axis_table_is_the_results_files_and_on_the_page():
    """B2 across partition counts (issue 66): the benchmarks page carries the table, as computed from every run in
    the results files, each count judged against the same rows in 2 partitions."""
    docs = (ROOT / "docs" / "benchmarks.md").read_text()
    block = table.axis_table()
    assert block in docs and all(table.AXIS_MARKERS[i] in docs for i in (0, 1))
    rows = [ln for ln in block.splitlines()[2:]]
    assert len(rows) == len(table.AXIS) and rows[0].split(" | ")[2] == "1.00×, 1.00×"
