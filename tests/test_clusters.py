"""``clusters/``: every file parses and names only options that exist — the launcher YAMLs
against Ray's own schema, the KubeRay manifests against a structural schema of the CRDs'
required parts, the runtime_env through ``RuntimeEnv``, and the RayJob's entrypoint through
vfray's own command-line parser."""

from __future__ import annotations

import copy
import shlex
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import yaml

from vfray.cli.main import main

CLUSTERS = Path(__file__).resolve().parent.parent / "clusters"


def load(name: str) -> Any:
    return yaml.safe_load((CLUSTERS / name).read_text())


def test_every_file_parses() -> None:
    names = sorted(p.name for p in CLUSTERS.iterdir())
    for expected in (
        "README.md",
        "aws.yaml",
        "gcp.yaml",
        "kuberay-raycluster.yaml",
        "kuberay-rayjob.yaml",
        "runtime_env.yaml",
    ):
        assert expected in names
    for name in names:
        if name.endswith(".yaml"):
            assert isinstance(load(name), dict), name


# -- cluster launcher -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["aws.yaml", "gcp.yaml"])
def test_launcher_config_passes_rays_validation(name: str) -> None:
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = load(name)
    validate_config(config)
    # With Ray's provider defaults filled in, as `ray up` does before launching.
    validate_config(prepare_config(copy.deepcopy(config)))
    assert config["head_node_type"] in config["available_node_types"]


def test_launcher_validation_rejects_a_misspelled_option() -> None:
    """The check has teeth: an option Ray does not know fails it."""
    from ray.autoscaler._private.util import validate_config

    config = load("aws.yaml")
    config["idle_timeout_minute"] = 5
    with pytest.raises(jsonschema.ValidationError):
        validate_config(config)


# -- KubeRay --------------------------------------------------------------------------------

CONTAINER = {
    "type": "object",
    "required": ["name", "image"],
    "properties": {
        "name": {"type": "string"},
        "image": {"type": "string", "pattern": r"^rayproject/ray:\d+\.\d+\.\d+"},
        "env": {
            "type": "array",
            "items": {"type": "object", "required": ["name"]},
        },
        "ports": {
            "type": "array",
            "items": {"type": "object", "required": ["containerPort"]},
        },
        "resources": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"requests": {"type": "object"}, "limits": {"type": "object"}},
        },
    },
}
POD_TEMPLATE = {
    "type": "object",
    "required": ["spec"],
    "properties": {
        "spec": {
            "type": "object",
            "required": ["containers"],
            "properties": {"containers": {"type": "array", "minItems": 1, "items": CONTAINER}},
        }
    },
}
# rayStartParams values are strings in the CRD (map[string]string).
START_PARAMS = {"type": "object", "additionalProperties": {"type": "string"}}
RAY_CLUSTER_SPEC = {
    "type": "object",
    "required": ["headGroupSpec"],
    "additionalProperties": False,
    "properties": {
        "rayVersion": {"type": "string"},
        "enableInTreeAutoscaling": {"type": "boolean"},
        "autoscalerOptions": {"type": "object"},
        "headServiceAnnotations": {"type": "object"},
        "suspend": {"type": "boolean"},
        "headGroupSpec": {
            "type": "object",
            "required": ["rayStartParams", "template"],
            "additionalProperties": False,
            "properties": {
                "serviceType": {"enum": ["ClusterIP", "NodePort", "LoadBalancer"]},
                "rayStartParams": START_PARAMS,
                "template": POD_TEMPLATE,
                "enableIngress": {"type": "boolean"},
            },
        },
        "workerGroupSpecs": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["groupName", "rayStartParams", "template"],
                "additionalProperties": False,
                "properties": {
                    "groupName": {"type": "string"},
                    "replicas": {"type": "integer", "minimum": 0},
                    "minReplicas": {"type": "integer", "minimum": 0},
                    "maxReplicas": {"type": "integer", "minimum": 0},
                    "numOfHosts": {"type": "integer", "minimum": 1},
                    "rayStartParams": START_PARAMS,
                    "template": POD_TEMPLATE,
                },
            },
        },
    },
}
METADATA = {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}


def manifest(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": "ray.io/v1"},
            "kind": {"const": kind},
            "metadata": METADATA,
            "spec": spec,
        },
    }


RAY_JOB_SPEC = {
    "type": "object",
    "required": ["entrypoint", "rayClusterSpec"],
    "additionalProperties": False,
    "properties": {
        "entrypoint": {"type": "string"},
        "runtimeEnvYAML": {"type": "string"},
        "submissionMode": {"enum": ["K8sJobMode", "HTTPMode", "InteractiveMode"]},
        "shutdownAfterJobFinishes": {"type": "boolean"},
        "ttlSecondsAfterFinished": {"type": "integer", "minimum": 0},
        "activeDeadlineSeconds": {"type": "integer", "minimum": 1},
        "backoffLimit": {"type": "integer", "minimum": 0},
        "rayClusterSpec": RAY_CLUSTER_SPEC,
    },
}


def min_max_replicas_hold(spec: dict[str, Any]) -> None:
    for group in spec.get("workerGroupSpecs", []):
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"], group


def test_raycluster_manifest_structure() -> None:
    data = load("kuberay-raycluster.yaml")
    jsonschema.validate(data, manifest("RayCluster", RAY_CLUSTER_SPEC))
    min_max_replicas_hold(data["spec"])


def test_rayjob_manifest_structure() -> None:
    data = load("kuberay-rayjob.yaml")
    jsonschema.validate(data, manifest("RayJob", RAY_JOB_SPEC))
    min_max_replicas_hold(data["spec"]["rayClusterSpec"])


def test_structural_schema_rejects_a_misplaced_field() -> None:
    data = load("kuberay-raycluster.yaml")
    data["spec"]["workerGroupSpecs"][0]["replica"] = 3  # typo of "replicas"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, manifest("RayCluster", RAY_CLUSTER_SPEC))


def test_images_match_the_declared_ray_version() -> None:
    for name in ("kuberay-raycluster.yaml", "kuberay-rayjob.yaml"):
        data = load(name)
        spec = data["spec"].get("rayClusterSpec", data["spec"])
        groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
        for group in groups:
            for container in group["template"]["spec"]["containers"]:
                assert container["image"].startswith(f"rayproject/ray:{spec['rayVersion']}")


def test_rayjob_entrypoint_is_a_valid_vfray_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = shlex.split(load("kuberay-rayjob.yaml")["spec"]["entrypoint"])
    assert argv[:2] == ["vfray", "eval"]
    code = main([*argv[1:], "--dry-run"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert '"base_url": "http://vllm.default.svc.cluster.local:8000/v1"' in out


# -- runtime_env ----------------------------------------------------------------------------


def check_runtime_env(data: dict[str, Any]) -> None:
    from ray.runtime_env import RuntimeEnv

    # RuntimeEnv passes unknown keys to plugins, so a typo would slip through: name them.
    unknown = set(data) - set(RuntimeEnv.known_fields)
    assert not unknown, f"unknown runtime_env keys: {unknown}"
    RuntimeEnv(**data)


def test_runtime_env_validates() -> None:
    check_runtime_env(load("runtime_env.yaml"))


def test_runtime_env_wheel_is_not_left_out_of_the_upload() -> None:
    """Ray's working_dir upload leaves out what .gitignore names: the wheel must be outside
    it (it was in dist/, and a job submitted from the repository failed for want of it)."""
    import subprocess

    data = load("runtime_env.yaml")
    prefix = "${RAY_RUNTIME_ENV_CREATE_WORKING_DIR}/"
    (wheel,) = [p[len(prefix) :] for p in data["pip"]["packages"] if p.startswith(prefix)]
    root = CLUSTERS.parent
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", "-q", wheel], cwd=root, check=False
    )
    if ignored.returncode == 128:
        pytest.skip("not a git checkout")
    assert ignored.returncode == 1, f"{wheel} is git-ignored, so Ray would not upload it"
    assert "VFRAY_OUTPUT_DIR" not in data.get("env_vars", {})  # ~/vfray-outputs, as documented


def test_rayjob_runtime_env_validates() -> None:
    check_runtime_env(yaml.safe_load(load("kuberay-rayjob.yaml")["spec"]["runtimeEnvYAML"]))


def test_runtime_env_check_has_teeth() -> None:
    with pytest.raises(AssertionError):
        check_runtime_env({"piip": ["vfray"]})
    with pytest.raises(TypeError):
        check_runtime_env({"pip": 3})


# -- shipping vfray (not on PyPI) -----------------------------------------------------------


def wheel_name() -> str:
    import tomllib

    version = tomllib.loads((CLUSTERS.parent / "pyproject.toml").read_text())["project"]["version"]
    return f"vfray-{version}-py3-none-any.whl"


def pip_requirements() -> dict[str, list[str]]:
    """Every requirement each file hands to pip (runtime_env ``pip`` and launcher commands)."""
    found: dict[str, list[str]] = {}
    found["runtime_env.yaml"] = list(load("runtime_env.yaml")["pip"]["packages"])
    rayjob = yaml.safe_load(load("kuberay-rayjob.yaml")["spec"]["runtimeEnvYAML"])
    found["kuberay-rayjob.yaml"] = list(rayjob["pip"])
    for name in ("aws.yaml", "gcp.yaml"):
        config = load(name)
        commands = [*config["setup_commands"], *config["head_setup_commands"]]
        found[name] = [
            word
            for command in commands
            if "pip install" in command
            for word in shlex.split(command.split("pip install", 1)[1])
            if not word.startswith("-")
        ]
    return found


def test_no_file_asks_the_package_index_for_vfray() -> None:
    """vfray is not on PyPI: every file installs the wheel built from this tree, by name."""
    for name, requirements in pip_requirements().items():
        vfray = [r for r in requirements if "vfray" in r]
        assert vfray, name
        for requirement in vfray:
            assert requirement.endswith(wheel_name()), (name, requirement)


def test_launcher_configs_ship_the_wheel_and_keep_ray_auth_on() -> None:
    for name in ("aws.yaml", "gcp.yaml"):
        config = load(name)
        assert config["file_mounts"]["~/vfray-dist"] == "./dist", name
        assert config["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token", name
        for command in [*config["head_start_ray_commands"], *config["worker_start_ray_commands"]]:
            if "ray start" in command:
                assert command.startswith("RAY_AUTH_MODE=token ray start"), (name, command)
