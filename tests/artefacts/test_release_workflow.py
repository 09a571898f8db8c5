"""The release workflow (.github/workflows/release.yaml), which cannot run here (no Docker engine, no GitHub).

What can be proven here is: actionlint (built from its Go module by tools/actionlint-build.sh) and Debian's
shellcheck find nothing in it, and do find what is planted in a broken copy; its version check step,
run by bash on copies of the checkout, passes for the chart's tag and fails, naming the file, for a tag or
a file that disagrees; the image goes where the chart's defaults pull from and the chart to an OCI
repository beside it, under the name `helm package` gives; every action is pinned by commit; the job
holds only the permissions it uses. `helm lint --strict` of the chart is tests/artefacts/test_packaging.py's.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from vllm_operator import generate

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "release.yaml"
CHART = ROOT / generate.CHART
#: What the version check step reads (and nothing else of the checkout).
CHECKED_FILES = ("charts/vllm-operator/Chart.yaml", "charts/vllm-operator/values.yaml", "pyproject.toml",
                 "operator/vllm_operator/__init__.py")


def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def job() -> dict:
    (only,) = workflow()["jobs"].values()
    return only


def steps() -> list[dict]:
    return job()["steps"]


def step(id_or_name: str) -> dict:
    (found,) = [s for s in steps() if id_or_name in (s.get("id"), s.get("name"))]
    return found


def index_of(predicate) -> list[int]:
    return [i for i, s in enumerate(steps()) if predicate(s)]


def chart() -> dict:
    return yaml.safe_load((CHART / "Chart.yaml").read_text())


def values() -> dict:
    return yaml.safe_load((CHART / "values.yaml").read_text())


# --------------------------------------------------------------------------- the linters
@pytest.fixture(scope="module")
def actionlint() -> str:
    """actionlint built from its pinned Go module (cached; nothing to do once built)."""
    p = subprocess.run(["bash", str(ROOT / "tools" / "actionlint-build.sh")], capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def shellcheck() -> str:
    found = shutil.which("shellcheck")
    if found is None:
        raise RuntimeError("shellcheck is not installed (apt-get install shellcheck; tools/run-tests.sh does it)")
    return found


def lint(actionlint: str, shellcheck: str, text: str, workdir: Path) -> subprocess.CompletedProcess:
    path = workdir / ".github" / "workflows" / "release.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    # -shellcheck names the binary: actionlint silently skips the run: scripts when it finds none.
    return subprocess.run([actionlint, "-no-color", "-shellcheck", shellcheck, str(path)], capture_output=True,
                          text=True, timeout=120)


def by_release(text: str) -> str:
    """Each `@<commit> # vX.Y.Z` as `@vX`: actionlint checks the inputs given to the actions it knows only by
    their major release (a commit tells it nothing), so this copy is how the pinned actions' inputs are checked."""
    return re.sub(r"@[0-9a-f]{40} # (v\d+)\.\d+\.\d+", r"@\1", text)


def test_actionlint_and_shellcheck_find_nothing(actionlint, shellcheck, tmp_path):
    p = lint(actionlint, shellcheck, WORKFLOW.read_text(), tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr


def test_every_input_given_to_an_action_exists_in_its_release(actionlint, shellcheck, tmp_path):
    text = by_release(WORKFLOW.read_text())
    assert "docker/build-push-action@v7" in text
    p = lint(actionlint, shellcheck, text, tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.parametrize("old,new,finding", [
    # an output of a step that does not exist (actionlint's expression checker)
    ("${{ steps.versions.outputs.version }}", "${{ steps.version.outputs.version }}", 'property "version"'),
    # an unquoted expansion in a run: script (shellcheck, through actionlint)
    ('helm push "dist/vllm-operator-$VERSION.tgz"', "helm push dist/vllm-operator-$VERSION.tgz", "SC2086"),
    # a permission that does not exist
    ("packages: write", "packages: wrte", '"wrte" is invalid as permission'),
    # an input the action's release does not have
    ("          push: true\n", "          push: true\n          pusher: true\n", 'input "pusher" is not defined'),
], ids=["expression", "shellcheck", "permission", "action-input"])
def test_the_linters_catch_what_is_planted_in_a_copy(actionlint, shellcheck, tmp_path, old, new, finding):
    text = WORKFLOW.read_text()
    assert old in text
    p = lint(actionlint, shellcheck, by_release(text.replace(old, new, 1)), tmp_path)
    assert p.returncode == 1 and finding in p.stdout, p.stdout + p.stderr


# --------------------------------------------------------------------------- when, and with what rights
def test_it_runs_on_version_tags_only():
    on = workflow()[True]  # YAML 1.1 reads the key `on` as a boolean
    assert on == {"push": {"tags": ["v*"]}}


def test_the_job_holds_only_what_it_uses():
    assert workflow()["permissions"] == {}
    assert job()["permissions"] == {"contents": "read", "packages": "write"}
    checkout = steps()[0]
    assert checkout["uses"].startswith("actions/checkout@") and checkout["with"]["persist-credentials"] is False


def test_every_action_is_pinned_by_commit_with_its_release_in_a_comment():
    uses = [line.strip() for line in WORKFLOW.read_text().splitlines() if re.match(r"\s*(- )?uses:", line)]
    assert len(uses) == len([s for s in steps() if "uses" in s]) >= 5
    for line in uses:
        assert re.fullmatch(r"(- )?uses: [\w.-]+/[\w.-]+(/[\w./-]+)?@[0-9a-f]{40} # v\d+\.\d+\.\d+", line), line


# --------------------------------------------------------------------------- where it pushes
def test_the_image_goes_where_the_charts_defaults_pull_from():
    env = workflow()["env"]
    assert env["IMAGE"] == values()["image"]["repository"]
    assert values()["image"]["tag"] == "", "the chart pulls its appVersion, the tag the workflow pushes"
    build = step("Build and push the image")
    assert build["uses"].startswith("docker/build-push-action@")
    assert build["with"]["push"] is True and build["with"]["context"] == "."
    assert build["with"]["tags"] == "${{ env.IMAGE }}:${{ steps.versions.outputs.version }}"
    login = step("Log in to the registry")
    assert login["with"]["registry"] == "${{ steps.versions.outputs.registry }}"
    assert login["with"]["password"] == "${{ secrets.GITHUB_TOKEN }}"


def test_the_chart_goes_to_an_oci_repository_beside_the_image_under_the_name_helm_package_gives(tmp_path):
    env = workflow()["env"]
    registry_and_owner = env["IMAGE"].rsplit("/", 1)[0]
    assert env["CHART_REPOSITORY"] == f"oci://{registry_and_owner}/charts"
    run = step("Package and push the chart")["run"]
    assert "helm package charts/vllm-operator --destination dist" in run
    assert 'helm push "dist/vllm-operator-$VERSION.tgz" "$CHART_REPOSITORY"' in run
    archive = Path(generate.helm_python().package(str(CHART), destination=str(tmp_path)))
    assert archive.name == f"{chart()['name']}-{chart()['version']}.tgz"


def test_it_releases_with_the_helm_the_tests_use():
    assert workflow()["env"]["HELM_VERSION"] == generate.helm_python().helm_sdk_version()
    assert step("Lint the chart")["run"] == "helm lint --strict charts/vllm-operator"


# --------------------------------------------------------------------------- the version check
def test_the_version_check_comes_before_anything_is_built_or_pushed():
    (check,) = index_of(lambda s: s.get("id") == "versions")
    builds = index_of(lambda s: "docker/" in s.get("uses", "") or "helm" in s.get("run", "") or "helm" in s.get(
        "uses", ""))
    assert check == 1 and builds and min(builds) > check


def run_check(tmp_path: Path, tag: str, edit: tuple[str, str, str] | None = None) -> tuple[int, str, dict]:
    """The check step's script, run by bash on a copy of the files it reads, as the runner would."""
    for rel in CHECKED_FILES:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    if edit:
        rel, old, new = edit
        text = (tmp_path / rel).read_text()
        assert old in text, (rel, old)
        (tmp_path / rel).write_text(text.replace(old, new, 1))
    output = tmp_path / "github_output"
    output.touch()
    env = {"PATH": "/usr/bin:/bin", "TAG": tag, "GITHUB_OUTPUT": str(output), **workflow()["env"]}
    step_ = step("versions")
    assert step_["env"] == {"TAG": "${{ github.ref_name }}"}
    p = subprocess.run(["bash", "-e", "-c", step_["run"]], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=60)
    outputs = dict(line.split("=", 1) for line in output.read_text().splitlines())
    return p.returncode, p.stdout + p.stderr, outputs


def test_the_version_check_passes_for_the_charts_tag_and_says_what_to_push(tmp_path):
    rc, log, outputs = run_check(tmp_path, f"v{chart()['version']}")
    assert rc == 0, log
    assert outputs == {"version": chart()["version"], "registry": values()["image"]["repository"].split("/")[0]}
    assert chart()["appVersion"] == chart()["version"]


VERSION = "0.1.0"  # what the repository says now (the first case below checks it)


@pytest.mark.parametrize("tag,edit,blamed", [
    ("v0.1.1", None, "charts/vllm-operator/Chart.yaml"),
    ("0.1.0", None, "charts/vllm-operator/Chart.yaml"),
    ("v0.1.0", ("charts/vllm-operator/Chart.yaml", 'appVersion: "0.1.0"', 'appVersion: "0.1.1"'),
     "Chart.yaml's appVersion (0.1.1)"),
    ("v0.1.0", ("charts/vllm-operator/Chart.yaml", "version: 0.1.0", "version: 0.2.0"),
     "Chart.yaml's version (0.2.0)"),
    ("v0.1.0", ("pyproject.toml", 'version = "0.1.0"', 'version = "0.1.1"'), "::error file=pyproject.toml::"),
    ("v0.1.0", ("operator/vllm_operator/__init__.py", '"0.1.0"', '"0.1.1"'),
     "::error file=operator/vllm_operator/__init__.py::"),
    ("v0.1.0", ("charts/vllm-operator/values.yaml", "repository: ghcr.io/vllm-operator/vllm-operator",
                "repository: ghcr.io/someone-else/vllm-operator"), "image.repository (ghcr.io/someone-else/"),
], ids=["newer-tag", "no-v", "appVersion", "version", "pyproject", "__version__", "values-repository"])
def test_the_version_check_fails_on_any_disagreement_and_names_the_file(tmp_path, tag, edit, blamed):
    assert chart()["version"] == VERSION, "update VERSION and the edits above with the chart's version"
    rc, log, outputs = run_check(tmp_path, tag, edit)
    assert rc != 0 and blamed in log, log
    assert outputs == {}, "nothing to push is said when the check fails"
