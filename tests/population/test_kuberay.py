"""deploy/kuberay: the RayJob and RayCluster manifests validate against KubeRay's own CRD schemas (vendored from
kuberay v1.7.0, deploy/kuberay/schemas/README.md) with check-jsonschema; a misspelt field fails."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kuberay"
MANIFESTS = {"rayjob.yaml": "rayjob-v1.json", "raycluster.yaml": "raycluster-v1.json"}


def closed(schema: Any) -> Any:
    """The schema with every object that lists its properties closed to others (``additionalProperties: false``),
    as ``kubectl apply --validate=strict`` rejects unknown fields; objects that keep unknown fields stay open."""
    if isinstance(schema, dict):
        out = {k: closed(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [closed(v) for v in schema]
    return schema


def check(manifest: Path, schema_name: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    schema = closed(json.loads((DEPLOY / "schemas" / schema_name).read_text()))
    schema_path = tmp_path / schema_name
    schema_path.write_text(json.dumps(schema))
    exe = shutil.which("check-jsonschema") or str(Path(sys.executable).parent / "check-jsonschema")
    return subprocess.run([exe, "--schemafile", str(schema_path), str(manifest)], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("manifest", sorted(MANIFESTS))
def test_manifest_matches_the_kuberay_crd(manifest: str, tmp_path: Path) -> None:
    result = check(DEPLOY / manifest, MANIFESTS[manifest], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_misspelt_field_fails(tmp_path: Path) -> None:
    doc = yaml.safe_load((DEPLOY / "rayjob.yaml").read_text())
    doc["spec"]["shutdownAfterJobFinish"] = doc["spec"].pop("shutdownAfterJobFinishes")  # one letter short
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    result = check(bad, "rayjob-v1.json", tmp_path)
    assert result.returncode != 0 and "shutdownAfterJobFinish" in result.stdout + result.stderr


def test_the_job_runs_jaderl_pbt_on_the_shared_volume() -> None:
    job = yaml.safe_load((DEPLOY / "rayjob.yaml").read_text())
    assert job["spec"]["entrypoint"].startswith("jaderl pbt ")
    assert "--run-dir /data/" in job["spec"]["entrypoint"]
    cluster = job["spec"]["rayClusterSpec"]
    pods = [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]
    for pod in pods:  # every pod mounts the same claim at /data: members write their run directories there
        (container,) = pod["spec"]["containers"]
        assert {"name": "populations", "mountPath": "/data"} in container["volumeMounts"]
        assert pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "jaderl-populations"
