"""`ec2gpu bench`'s arithmetic (bytes, FLOPs, peaks, USD per run, ranking) and how its results
feed the next estimate; all pure, no torch."""
import pytest

from ec2gpu.runs.provision import bench
from ec2gpu.runs.plan import costs
from ec2gpu.train import bench as instance


def test_bytes_and_flops_follow_stream_and_the_matmul_count():
    assert instance.copy_bytes(1000, 4) == 8000  # read once, written once
    assert instance.triad_bytes(1000, 4) == 12000  # a = b + s*c: b and c read, a written
    assert instance.matmul_flops(2, 3, 4) == 48  # 2*m*n*k: a multiply and an add per term
    assert instance.matmul_flops(8192, 8192, 8192) == 2 * 8192 ** 3


@pytest.mark.parametrize("name, model", [
    ("Tesla T4", "T4"), ("NVIDIA A10G", "A10G"), ("NVIDIA L4", "L4"), ("Tesla V100-SXM2-16GB", "V100"),
    ("NVIDIA A100-SXM4-40GB", "A100"), ("NVIDIA H100 80GB HBM3", "H100"),
    ("NVIDIA A100-SXM4-80GB", "A100-80GB"), ("NVIDIA L40S", "L40S"), ("NVIDIA H200", "H200"), ("NVIDIA B200", "B200"),
    ("NVIDIA A10", None), ("NVIDIA L40", None), ("", None), (None, None),
])
def test_the_catalog_gpu_is_found_in_the_device_name_and_nothing_else(name, model):
    assert instance.gpu_model(name) == model


def test_each_gpu_figure_is_set_beside_its_datasheet_peak():
    got = instance.against_peak({"triad_gbs": 240.0, "copy_gbs": 256.0, "fp32_tflops": 4.05, "fp16_tflops": 26.0,
                                 "tf32_tflops": 4.0, "h2d_pinned_gbs": 12.0, "elements": 10}, "T4")
    assert got["triad_gbs"] == {"measured": 240.0, "peak": 320, "fraction": 0.75}
    assert got["fp32_tflops"]["fraction"] == 0.5 and got["fp16_tflops"]["peak"] == 65.0
    assert "tf32_tflops" not in got  # a T4 has no tf32 mode: no peak to compare with
    assert "h2d_pinned_gbs" not in got and "elements" not in got  # PCIe, not the GPU's memory
    assert instance.against_peak({"triad_gbs": 1.0}, None) == {}


def test_every_catalog_gpu_has_a_peak():
    from ec2gpu.aws.catalog import CATALOG
    assert {t.gpu for t in CATALOG.values()} <= set(instance.GPU_PEAKS)


def _summary(cnn_cuda=None, cnn_cpu=None, quick=False, best="cuda"):
    models = {"cnn": {}}
    if cnn_cuda:
        models["cnn"]["cuda"] = cnn_cuda
    if cnn_cpu:
        models["cnn"]["cpu"] = cnn_cpu
    return {"kind": "bench", "quick": quick, "best_device": best, "models": models}


def test_usd_per_run_is_the_time_to_target_on_the_best_device_times_the_price():
    s = _summary(cnn_cuda={"train_seconds": 5.0, "time_to_target_seconds": 3.6, "samples_per_second": 60000},
                 cnn_cpu={"train_seconds": 50.0, "time_to_target_seconds": 40.0, "samples_per_second": 6000})
    assert bench.usd_per_run(s, 1.0) == {"cnn": {"seconds": 3.6, "basis": "to target", "usd": 0.001}}
    s["models"]["cnn"]["cuda"]["time_to_target_seconds"] = None
    assert bench.usd_per_run(s, 0.36)["cnn"] == {"seconds": 5.0, "basis": "whole run (target not reached)",
                                                 "usd": 0.0005}
    assert bench.usd_per_run(s, None)["cnn"]["usd"] is None
    assert bench.usd_per_run(None, 1.0) == {}


def test_types_are_ranked_by_usd_per_run_and_unpriced_or_failed_ones_come_last():
    a = {"instance_type": "g5.xlarge", "usd_per_run": {"cnn": {"usd": 0.002}, "dbn": {"usd": 0.01}}}
    b = {"instance_type": "g4dn.xlarge", "usd_per_run": {"cnn": {"usd": 0.001}, "dbn": {"usd": 0.02}}}
    c = {"instance_type": "g6.xlarge", "usd_per_run": {"cnn": {"usd": None}}}
    d = {"instance_type": "p3.2xlarge", "status": "failed", "usd_per_run": {}}
    assert [r["instance_type"] for r in bench.rank([c, d, a, b])] == ["g4dn.xlarge", "g5.xlarge", "g6.xlarge",
                                                                       "p3.2xlarge"]


def _bench_run(run_id, itype, gpu, sps, quick=False):
    return {"run_id": run_id, "task": "bench", "instance_type": itype, "gpu": gpu, "status": "completed",
            "summary": _summary(cnn_cuda={"samples_per_second": sps, "train_seconds": 1.0}, quick=quick)}


def test_a_bench_of_the_type_replaces_the_assumed_epoch_time_and_the_estimate_says_so():
    assumed = costs.estimate("g4dn.xlarge", "T4", "on-demand", 0.526, "table", "cnn", 2, [])
    history = [_bench_run("r-quick", "g4dn.xlarge", "T4", 30000.0, quick=True),
               _bench_run("r-full", "g4dn.xlarge", "T4", 20000.0),
               _bench_run("r-other-gpu", "g5.xlarge", "A10G", 90000.0)]
    e = costs.estimate("g4dn.xlarge", "T4", "on-demand", 0.526, "table", "cnn", 2, history)
    # the full-size bench is preferred to the newer --quick one: 60,000 images / 20,000 per s per epoch
    assert e.train_seconds == pytest.approx(costs.DEFAULT_TRAINER_STARTUP_SECONDS + 2 * 3.0)
    assert "measured: 20,000 samples/s for cnn on the GPU of g4dn.xlarge by bench r-full" in e.time_source
    assert e.train_seconds != assumed.train_seconds
    # another type with the same GPU model counts; a model the bench did not run keeps the default
    same_gpu = costs.estimate("g4dn.2xlarge", "T4", "on-demand", 0.752, "table", "cnn", 1, history)
    assert "r-full" in same_gpu.time_source
    assert "assumed" in costs.estimate("g4dn.xlarge", "T4", "on-demand", 0.526, "table", "mlp", 1, history).time_source


def test_runs_of_the_model_itself_still_come_before_a_bench():
    history = [_bench_run("r-full", "g4dn.xlarge", "T4", 20000.0),
               {"instance_type": "g4dn.xlarge", "gpu": "T4", "model": "cnn", "train_seconds": 8.0, "epochs": 2,
                "phases": {"running": 40.0}, "status": "completed"}]
    e = costs.estimate("g4dn.xlarge", "T4", "on-demand", 0.526, "table", "cnn", 2, history)
    assert e.time_source.startswith("ledger (1 earlier run of cnn on T4)")
