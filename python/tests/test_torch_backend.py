"""The "ferrocx" backend of torch.distributed, in jobs of real processes on the host backend:
every operation against gloo's result on the same inputs, DDP against gloo (one cluster and two
clusters bridged), functional collectives and torch.compile, `ferrocx launch`, bad input."""

import pytest

from conftest import run_job, two_cluster_config


@pytest.mark.parametrize("world", [2, 3])
def test_every_operation_matches_gloo(world):
    run_job("ops.py", world).expect_ok("ops ok", world)


def test_new_groups_beside_a_default_group_bound_to_a_device():
    run_job("groups.py", 3).expect_ok("groups ok", 3)


def test_ddp_matches_gloo():
    run_job("ddp.py", 3).expect_ok("ddp ok", 3)


@pytest.mark.parametrize("first,world", [(1, 3)])
def test_ddp_across_two_clusters_matches_gloo(tmp_path, first, world):
    """The CPU-only stand-in of a GPU cluster beside a CPU cluster: two host clusters."""
    cfg = two_cluster_config(tmp_path, first, world)
    job = run_job("ddp.py", world, env={"FERROCX_CONFIG": cfg})
    job.expect_ok("ddp ok", world)
    assert len(job.lines("(left, cpu)")) == first and len(job.lines("(right, cpu)")) == world - first, job.out


def test_every_operation_across_two_clusters_matches_gloo(tmp_path):
    cfg = two_cluster_config(tmp_path, 1, 2)
    run_job("ops.py", 2, env={"FERROCX_CONFIG": cfg}).expect_ok("ops ok", 2)


def test_functional_collectives_and_torch_compile():
    run_job("funcol.py", 2).expect_ok("funcol ok", 2)


def test_ddp_under_ferrocx_launch_matches_gloo():
    run_job("ddp.py", 2, launcher="ferrocx").expect_ok("ddp ok", 2)


@pytest.mark.parametrize("cases,world", [(["dtype", "op", "local", "shape"], 2), (["dead"], 3)])
def test_bad_input_raises_ferrocx_error(cases, world):
    job = run_job("errors.py", world, *cases, env={"FERROCX_TIMEOUT_MS": "5000"})
    survivors = world - 1 if cases == ["dead"] else world
    for case in cases:
        assert job.rc == 0 and len(job.lines(f"error ok: {case}:")) == survivors, (
            f"{case}: exit {job.rc}\n{job.out[-6000:]}"
        )


def test_ddp_futures_give_gloos_parameters_to_the_bit():
    """DDP's reducer and a Python comm hook over the backend's futures, 2 ranks: the parameters
    equal gloo's exactly; the futures' values are the reduced tensors."""
    run_job("ddp_future.py", 2).expect_ok("ddp future ok", 2)


@pytest.mark.parametrize("native", ["1", "0"])
def test_native_backend_takes_the_common_all_reduce_and_hands_the_rest_to_python(native):
    """The native backend (C++, built on first use) on the host device: a call waited for at
    once is its own, a call waited for later, a bool or a strided tensor goes to the Python
    group, each with reference values; FERROCX_TORCH_NATIVE=0 keeps the Python group."""
    run_job("native.py", 2, env={"FERROCX_TORCH_NATIVE": native}).expect_ok("native ok", 2)


def test_a_native_backend_that_cannot_be_built_leaves_the_python_group_working(tmp_path):
    """No working compiler (and no earlier build in the cache): every rank warns with the
    builder's reason and the Python group takes every call, with the same values."""
    job = run_job(
        "native.py",
        2,
        env={"FERROCX_CACHE_DIR": str(tmp_path / "cache"), "CXX": "false", "EXPECT_BUILD_FAILURE": "1"},
    )
    job.expect_ok("native ok", 2)
    assert len(job.lines("build failed as expected")) == 2, job.out[-4000:]
    assert "the native torch backend could not be built" in job.out, job.out[-4000:]
