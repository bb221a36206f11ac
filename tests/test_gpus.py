from tests import fake_nvidia_smi
from tfos_nb.runtime import gpus


def test_query_parses_csv_with_long_model_names(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", fake_nvidia_smi.path_with(fake_nvidia_smi.install(tmp_path)))
    found = gpus.query()
    assert [g["index"] for g in found] == ["0", "1"]
    assert found[0] == {
        "index": "0", "uuid": "GPU-11111111-aaaa", "name": "NVIDIA A100-SXM4-80GB",
        "memory_total": 81920, "memory_used": 1234,
    }
    assert [g["index"] for g in gpus.query(["1"])] == ["1"]


def test_query_without_nvidia_smi_is_empty(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpus.query() == []


def test_assign_splits_a_hosts_gpus_among_its_nodes():
    avail = [{"index": str(i)} for i in range(4)]
    assert [g["index"] for g in gpus.assign(avail, 0, 2, 2)] == ["0", "1"]
    assert [g["index"] for g in gpus.assign(avail, 1, 2, 2)] == ["2", "3"]
    assert [g["index"] for g in gpus.assign(avail, 1, 2, 1)] == ["1"]
    assert gpus.assign([], 0, 1, 1) == []
    assert gpus.assign(avail, 0, 1, 0) == []
