"""Build the bundle an air-gapped GPU node lacks: a folder of wheels for its Python, and bubblewrap.

Why: GPU nodes are often lent for minutes, with no package registry and a limit on what can be brought; their Python
already holds torch, transformers and much more, at versions of its own. The bundle carries exactly what the node
lacks of the project's pinned dependencies and their transitive needs, built for the node's Python and platform, so
that two lines on the node make the project run there:

    python3 -m pip install --no-index --no-deps --target DIR BUNDLE/wheels/*.whl
    export PYTHONPATH=REPO:DIR PATH=BUNDLE/bin:$PATH

How: pip's own resolver (``pip install --dry-run --report``, ``--only-binary=:all:`` with the node's
``--python-version``/``--platform``/``--abi``) over the role's pins, the node's known versions as constraints;
packages with only an sdist get a wheel built locally with a Python of the node's version and are offered to the
resolver (``--find-links``); then ``pip download --no-deps`` of what the node does not have. Where the project works
with the node's own version of a package (``RELAXED``: torch, numpy, ...), the node's is kept and the manifest says
why. ray (79 MB) cannot be carried: the bundle leaves out ray and evotorch, and a search on the node uses a searcher
that needs neither (``es=openai_es_elite`` or ``es=cmaes``; meta/searchers refuses the others there by name).

Roles: ``member`` (what a GPU node needs to run members: training, grading, the member wrapper) and ``job`` (the
whole main job on one node, orchestrator, tables and tuning included).

    scripts/node_bundle.sh --node-packages node-freeze.txt --role job --out .node_bundle
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
logger = logging.getLogger("node_bundle")

MANIFEST = "manifest.json"
WHEELS = "wheels"
BIN = "bin"
ROLES = ("member", "job")
DEFAULT_MAX_MIB = 48.0
DEFAULT_PYTHON = "3.12"
#: manylinux levels offered to pip (it matches each exactly: every glibc level from 2.17 to 2.39); linux_x86_64
#: takes the wheels built here
DEFAULT_PLATFORMS = (*(f"manylinux_2_{n}_x86_64" for n in range(39, 16, -1)), "manylinux2014_x86_64",
                     "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64")
#: pins the bundle never carries, and why
NOT_CARRIED = {
    "ray": "its cp312 wheel is 79 MB (~240 MB installed): it cannot be brought; evotorch imports it at import time",
    "evotorch": "imports ray at import time; a search on the node uses es=openai_es_elite or es=cmaes, which need "
                "neither (meta/searchers refuses es=pgpe/snes/cem there with that message)",
}
#: pins only the orchestrator imports (searchers, tuning, plots): the ``member`` role leaves them out. Members import
#: pandas, pyarrow, scipy and tensorboard themselves (datasets, the trainer's logs); tests/scripts/test_node_bundle.py
#: checks, from the modules a real run's processes import, that each role carries what its processes need
ORCHESTRATOR_ONLY = {
    "cma": "es=cmaes's CMA-ES",
    "cmaes": "meta.tune's CmaEsSampler",
    "optuna": "meta.tune's study",
    "matplotlib": "results.report's plots",
}
#: pins where the node's own installed version is kept, and why the project works with it
RELAXED = {
    "torch": "the node's own CUDA build (the pin is the development machines' CPU wheel); the GPU pass and the "
             "rehearsal run on the node's torch",
    "numpy": "the pin is below 2.4 only for vLLM's mistral_common (the [vllm] extra), which the bundle does not carry",
    "pandas": "the tables use pandas' stable API (the rehearsal runs the job on the version pip picks for the node)",
    "pyarrow": "datasets 4.7 takes pyarrow >= 15; its parquet files are read by any release since",
    "scipy": "only t quantiles (scipy.stats.t)",
    "matplotlib": "only plain line plots",
    "tensorboard": "only event files through torch.utils.tensorboard",
}
#: top-level names in wheels that are not modules the project imports
NOT_MODULES = {"tests", "test", "testing", "docs", "doc", "examples", "benchmarks", "bin", "scripts", "share"}
NO_VERSION_FOUND = re.compile(r"No matching distribution found for ([^\s;]+)")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class BundleError(Exception):
    """A problem with the inputs or the bundle, in words for the user (exit status 2)."""


# ------------------------------------------------------------------ inputs
def parse_node_packages(text: str) -> dict[str, str | None]:
    """The node's packages from a ``pip freeze`` or a list of ``name==version`` / bare names: name -> version (None:
    installed, version not known). Comments, blank lines and options are skipped; ``name @ url`` has no version."""
    out: dict[str, str | None] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*(?:(===?)\s*([^\s;]+)|@\s*\S+)?\s*(;.*)?",
                             line)
        if match is None:
            raise BundleError(f"node package list, line {number}: {raw.strip()!r} is not `name==version`, a bare "
                              "name or `name @ url`")
        version = match.group(4)
        out[canonical(match.group(1))] = version.split("+")[0] if version else None
    if not out:
        raise BundleError("the node package list names no package")
    return out


def project_pins(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, str]:
    """The project's pinned dependencies: canonical name -> version (every one is ``==``)."""
    pins = {}
    for spec in tomllib.loads(pyproject.read_text())["project"]["dependencies"]:
        name, _, version = spec.partition("==")
        pins[canonical(name.strip())] = version.strip()
    return pins


def role_pins(role: str, pins: dict[str, str]) -> dict[str, str]:
    """The pins the role needs."""
    if role not in ROLES:
        raise BundleError(f"--role {role!r}: choose one of {list(ROLES)}")
    skip = set(NOT_CARRIED) | (set(ORCHESTRATOR_ONLY) if role == "member" else set())
    return {name: version for name, version in pins.items() if name not in skip}


# ------------------------------------------------------------------ the plan
@dataclass
class Target:
    """The node's interpreter and platform, as pip's cross-platform options name them."""

    python_version: str = DEFAULT_PYTHON
    platforms: tuple[str, ...] = DEFAULT_PLATFORMS

    @property
    def abi(self) -> str:
        return "cp" + self.python_version.replace(".", "")

    def pip_options(self) -> list[str]:
        out = ["--only-binary=:all:", "--python-version", self.python_version, "--implementation", "cp",
               "--abi", self.abi, "--abi", "abi3", "--abi", "none"]
        for plat in self.platforms:
            out += ["--platform", plat]
        return out


@dataclass
class Plan:
    """What the bundle carries and what it leaves to the node, with the reasons."""

    role: str
    target: Target
    bring: dict[str, str]                      # canonical name -> version to carry
    from_node: dict[str, str | None]           # resolved packages the node provides (its version, if known)
    relaxed: dict[str, str] = field(default_factory=dict)       # pin -> "pin X, node Y: why"
    shadowed: dict[str, str] = field(default_factory=dict)      # node package the bundle replaces -> why
    built: dict[str, str] = field(default_factory=dict)         # name -> the sdist built here into a wheel
    not_carried: dict[str, str] = field(default_factory=dict)


def _requirements(role: str, node: dict[str, str | None], pins: dict[str, str]) -> tuple[list[str], list[str],
                                                                                        dict[str, str], dict[str, str]]:
    """(requirements, constraints, relaxed, shadowed) for the resolver."""
    needed = role_pins(role, pins)
    requirements, relaxed, shadowed = [], {}, {}
    for name, pin in needed.items():
        have = node.get(name, "absent") if name in node else "absent"
        if name in RELAXED and name in node:
            relaxed[name] = f"pin {pin}, node {have or 'installed (version not read)'}: {RELAXED[name]}"
            requirements.append(f"{name}=={have}" if have else name)
            continue
        requirements.append(f"{name}=={pin}")
        if name in node and have != pin:
            shadowed[name] = (f"node {have or 'installed (version not read)'}, the project's pin {pin} is carried "
                              "and comes first on PYTHONPATH")
    constraints = [f"{name}=={version}" for name, version in node.items()
                   if version and name not in needed and name not in NOT_CARRIED]
    return requirements, constraints, relaxed, shadowed


#: the oldest pip known to check Requires-Python against --python-version in a --dry-run --target resolution (23.2
#: checked it against the running interpreter: "Package 'numpy' requires a different Python: 3.11.7 not in '>=3.12'")
MIN_PIP = (26, 2)


def check_pip() -> None:
    version = tuple(int(x) for x in re.findall(r"\d+", metadata.version("pip"))[:2])
    if version < MIN_PIP:
        raise BundleError(f"pip {metadata.version('pip')} here resolves for this Python, not the node's: upgrade it "
                          f"(`{sys.executable} -m pip install pip=={'.'.join(map(str, MIN_PIP))}.1`; scripts/setup.sh "
                          "does)")


def _pip(*args: str, quiet: bool = True) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", *args, "--disable-pip-version-check"]
    if quiet:
        cmd.append("-q")
    return subprocess.run(cmd, capture_output=True, text=True)


def find_build_python(version: str) -> str | None:
    """A Python of the node's version here, to build wheels of sdist-only packages (C extensions need it)."""
    for candidate in (shutil.which(f"python{version}"),
                      *sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}*/bin/python{version}")))):
        if candidate and "/shims/" not in candidate and os.access(candidate, os.X_OK):  # a shim may not run it
            return candidate
    return None


def build_wheel(spec: str, target: Target, build_python: str | None, into: Path) -> Path:
    """A wheel of ``spec`` built from its sdist with ``build_python``; refused if it does not fit the target."""
    python = build_python or find_build_python(target.python_version) or sys.executable
    logger.info("building a wheel of %s from its sdist with %s", spec, python)
    before = set(into.glob("*.whl"))
    done = subprocess.run([python, "-m", "pip", "wheel", "-q", "--no-deps", "--no-binary", ":all:", "-w", str(into),
                           spec], capture_output=True, text=True)
    made = sorted(set(into.glob("*.whl")) - before)
    if done.returncode or not made:
        raise BundleError(f"{spec} has no wheel for the node, and building one from its sdist failed:\n"
                          f"{done.stderr.strip()[-1500:]}")
    tags = made[0].name[:-4].split("-")[-3:]
    if tags[0] != "py3" and tags[0] != "py2.py3" and tags[0] != target.abi:
        raise BundleError(f"{spec} built as {made[0].name}, not for the node's Python {target.python_version}: give "
                          f"--build-python a Python {target.python_version} (pyenv install {target.python_version})")
    return made[0]


def resolve(role: str, node: dict[str, str | None], target: Target, built_dir: Path,
            build_python: str | None = None, pins: dict[str, str] | None = None) -> Plan:
    """The bundle's plan: pip's resolver for the target over the role's pins, sdists built where no wheel exists."""
    check_pip()
    pins = pins or project_pins()
    requirements, constraints, relaxed, shadowed = _requirements(role, node, pins)
    built: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="node_bundle-") as tmp:
        req, cons, report = Path(tmp, "requirements.txt"), Path(tmp, "constraints.txt"), Path(tmp, "report.json")
        req.write_text("\n".join(requirements) + "\n")
        cons.write_text("\n".join(constraints) + "\n")
        for _ in range(20):
            done = _pip("install", "--dry-run", "--ignore-installed", "--target", str(Path(tmp, "t")), "--report",
                        str(report), *target.pip_options(), "--find-links", str(built_dir), "-r", str(req), "-c",
                        str(cons))
            if done.returncode == 0:
                break
            missing = NO_VERSION_FOUND.search(done.stderr)
            if missing is None:
                raise BundleError("pip could not resolve the role's pins for the node:\n" + done.stderr.strip()[-2500:])
            spec = missing.group(1)
            if canonical(re.split(r"[<>=!~;\[ ]", spec, maxsplit=1)[0]) in {canonical(n) for n in built}:
                raise BundleError(f"{spec}: a wheel was built here, and pip still finds none for the node:\n"
                                  + done.stderr.strip()[-1500:])
            wheel = build_wheel(spec, target, build_python, built_dir)
            built[wheel.name.split("-")[0]] = spec
        else:
            raise BundleError("more than 20 packages had to be built from sdists: giving up")
        installs = json.loads(report.read_text())["install"]
    bring, from_node = {}, {}
    for item in installs:
        name, version = canonical(item["metadata"]["name"]), item["metadata"]["version"]
        if name in node and name not in shadowed:
            from_node[name] = node[name]
        else:
            bring[name] = version
    return Plan(role=role, target=target, bring=dict(sorted(bring.items())), from_node=dict(sorted(from_node.items())),
                relaxed=relaxed, shadowed=shadowed, built=built,
                not_carried={n: NOT_CARRIED[n] for n in NOT_CARRIED if n in pins})


# ------------------------------------------------------------------ the bundle
def wheel_modules(wheel: Path) -> list[str]:
    """The top-level modules a wheel installs (from its file list)."""
    names = set()
    with zipfile.ZipFile(wheel) as archive:
        for entry in archive.namelist():
            top = entry.split("/", 1)[0]
            if top.endswith((".dist-info", ".data")) or top.startswith("_") or top in NOT_MODULES:
                continue
            if "/" in entry:
                names.add(top)
            elif top.endswith(".py"):
                names.add(top[:-3])
            elif top.endswith(".so"):
                names.add(top.split(".", 1)[0])
    return sorted(names)


def installed_modules(name: str) -> list[str]:
    """The top-level modules of a distribution installed here (a node-provided pin's import names)."""
    mapping = metadata.packages_distributions()
    found = sorted(m for m, dists in mapping.items() if any(canonical(d) == name for d in dists)
                   and not m.startswith("_") and m not in NOT_MODULES)
    return found or [name.replace("-", "_")]


def fetch_bubblewrap(into: Path) -> str:
    """Debian's bubblewrap binary, extracted into ``into`` (it needs libselinux1, libcap2 and libpcre2-8 from the
    node); the result of running it from there, in words."""
    with tempfile.TemporaryDirectory(prefix="bwrap-") as tmp:
        got = subprocess.run(["apt-get", "download", "bubblewrap"], cwd=tmp, capture_output=True, text=True)
        debs = sorted(Path(tmp).glob("bubblewrap_*.deb"))
        if got.returncode or not debs:
            raise BundleError("could not download Debian's bubblewrap (apt-get download bubblewrap): "
                              f"{got.stderr.strip()[-500:]}; pass --no-bwrap to build the bundle without it")
        subprocess.run(["dpkg", "-x", str(debs[0]), str(Path(tmp, "x"))], check=True)
        into.mkdir(parents=True, exist_ok=True)
        shutil.copy2(Path(tmp, "x", "usr", "bin", "bwrap"), into / "bwrap")
        version = debs[0].name.split("_")[1]
    probe = subprocess.run([str(into / "bwrap"), "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "true"],
                           capture_output=True, text=True)
    if probe.returncode == 0:
        return f"bubblewrap {version}: runs from the bundle's folder (a namespaced `true` exited 0 here)"
    return (f"bubblewrap {version}: carried, but it could not make namespaces on this machine "
            f"({probe.stderr.strip()[-200:]}); the node's member pre-flight decides there")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def install_lines(bundle: Path, site: str = "/tmp/mirror-es-site", python: str = "python3") -> list[str]:
    """The two lines the node runs (from the repository's root)."""
    return [f"{python} -m pip install --no-index --no-deps --no-compile --target {site} {bundle}/{WHEELS}/*.whl",
            f"export PYTHONPATH=$PWD:{site} PATH=$PWD/{bundle}/{BIN}:$PATH"]


def build_bundle(plan: Plan, out: Path, built_dir: Path, max_mib: float, with_bwrap: bool) -> dict:
    """Download the plan's wheels into a new folder and move it to ``out`` only when it is whole and within
    ``max_mib``; returns the manifest."""
    parent = out.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=parent))
    umask = os.umask(0)
    os.umask(umask)
    # mkdtemp's 0700 would keep the sandbox's user (nobody) from bin/bwrap: the folder gets the user's umask
    staging.chmod(0o777 & ~umask)
    try:
        wheels = staging / WHEELS
        specs = [f"{name}=={version}" for name, version in plan.bring.items()]
        if specs:
            done = _pip("download", "--no-deps", *plan.target.pip_options(), "--find-links", str(built_dir), "-d",
                        str(wheels), *specs)
            if done.returncode:
                raise BundleError("pip download failed:\n" + done.stderr.strip()[-2500:])
        files = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
        sizes = {f.name: f.stat().st_size for f in files}
        bwrap = fetch_bubblewrap(staging / BIN) if with_bwrap else "not carried (--no-bwrap)"
        total = sum(f.stat().st_size for f in staging.rglob("*") if f.is_file()) / 2**20
        if total > max_mib:
            largest = sorted(sizes.items(), key=lambda kv: -kv[1])[:8]
            raise BundleError(f"the bundle would be {total:.1f} MiB, over --max-mib {max_mib:g}; its largest wheels: "
                              + ", ".join(f"{n} ({s / 2**20:.1f} MiB)" for n, s in largest))
        modules = sorted({m for f in files for m in wheel_modules(f)}
                         | {m for name in role_pins(plan.role, project_pins()) if name in plan.from_node
                            for m in installed_modules(name)})
        manifest = {"role": plan.role, "python_version": plan.target.python_version,
                    "platforms": list(plan.target.platforms), "size_mib": round(total, 2),
                    "wheels": [{"file": f.name, "bytes": sizes[f.name], "sha256": sha256(f)} for f in files],
                    "bring": plan.bring, "from_node": plan.from_node, "relaxed": plan.relaxed,
                    "shadowed": plan.shadowed, "built_here": plan.built, "not_carried": plan.not_carried,
                    "modules": modules, "bubblewrap": bwrap, "install": install_lines(Path(out.name))}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
        return manifest
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


# ------------------------------------------------------------------ main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--node-packages", type=Path, required=True,
                        help="the node's packages: `pip freeze` output, or name==version / bare names per line")
    parser.add_argument("--role", choices=ROLES, default="job", help="member: run members; job: the whole main job")
    parser.add_argument("--out", type=Path, default=Path(".node_bundle"), help="the bundle's folder (replaced)")
    parser.add_argument("--python-version", default=DEFAULT_PYTHON, help="the node's Python, e.g. 3.12")
    parser.add_argument("--platform", action="append", default=None,
                        help="the node's platform tags (repeatable; default: manylinux x86_64 levels)")
    parser.add_argument("--max-mib", type=float, default=DEFAULT_MAX_MIB, help="refuse a larger bundle")
    parser.add_argument("--build-python", default=None,
                        help="a Python of the node's version for sdist-only packages (default: found on PATH/pyenv)")
    parser.add_argument("--no-bwrap", action="store_true", help="leave Debian's bubblewrap out")
    parser.add_argument("--plan-only", action="store_true", help="print the plan as JSON; download nothing")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="node_bundle: %(message)s")
    try:
        if not opts.node_packages.is_file():
            raise BundleError(f"--node-packages {opts.node_packages}: no such file")
        node = parse_node_packages(opts.node_packages.read_text())
        target = Target(opts.python_version, tuple(opts.platform or DEFAULT_PLATFORMS))
        with tempfile.TemporaryDirectory(prefix="node_bundle-built-") as built:
            plan = resolve(opts.role, node, target, Path(built), opts.build_python)
            if opts.plan_only:
                print(json.dumps(plan.__dict__, default=lambda o: o.__dict__, indent=1))
                return 0
            manifest = build_bundle(plan, opts.out, Path(built), opts.max_mib, not opts.no_bwrap)
    except BundleError as exc:
        print(f"node_bundle: {exc}", file=sys.stderr)
        return 2
    logger.info("role %s for Python %s: %d wheels, %.1f MiB in %s", manifest["role"], manifest["python_version"],
                len(manifest["wheels"]), manifest["size_mib"], opts.out)
    for name, why in {**manifest["relaxed"], **manifest["shadowed"]}.items():
        logger.info("  %s: %s", name, why)
    for name, why in manifest["not_carried"].items():
        logger.info("  not carried: %s: %s", name, why)
    for name, spec in manifest["built_here"].items():
        logger.info("  built here from its sdist: %s (%s)", name, spec)
    logger.info("  %s", manifest["bubblewrap"])
    print("on the node, from the repository's root:")
    for line in manifest["install"]:
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
