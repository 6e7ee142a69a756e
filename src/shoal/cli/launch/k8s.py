"""``shoal launch k8s``, ``shoal launch runai`` and ``shoal launch image``: the job on Kubernetes.

``k8s`` renders a Kubeflow PyTorchJob, TrainJob or MPIJob and applies it with kubectl (or writes it
and prints the command to apply it); ``runai`` prints the Run:ai CLI's submit command for each CLI
generation; ``image`` writes the Dockerfile and .dockerignore of the job's image. Every check runs
before anything is written or applied.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
from dataclasses import dataclass

from shoal.cli.launch.common import (
    add_command,
    add_env,
    add_max_restarts,
    add_nodes,
    add_nproc,
    announce,
    check_replaceable,
    env_items,
    parser,
    shell,
    warn_local_paths,
    warn_missing_script,
    write_rendered,
)
from shoal.errors import ShoalError

KINDS = ("pytorchjob", "trainjob", "mpijob")
K8S_EXAMPLES = """\
examples:
  shoal launch k8s --image ghcr.io/me/train:1 --nnodes 2 -g 4 --dry-run -- shoal train mnist --data /data
  shoal launch k8s --kind trainjob --image IMG --nnodes 4 --volume shared:/data -- train.py
  shoal launch k8s --kind mpijob --image IMG --nnodes 2 --nproc 4 -- shoal train cifar10
  shoal launch k8s --image IMG --nnodes 2 --elastic 1:4 --max-restarts 3 -- shoal train digits
  shoal launch k8s --image IMG --secret-env WANDB_API_KEY=wandb:key --env NCCL_DEBUG=INFO -- x.py
See docs/KUBERNETES.md."""


def _add_pod(
    p: argparse.ArgumentParser,
    *,
    nodes_help: str,
    restarts_help: str = "pod restarts (restartPolicy OnFailure) before the job fails (default 0)",
) -> None:
    p.add_argument("--name", default="shoal", help="job name, a DNS-1035 label (default shoal)")
    p.add_argument("--image", help="container image every pod runs (required)")
    add_nodes(p, nodes_help)
    add_nproc(p, "processes per pod (default auto: one per GPU, or one on CPU)", auto=True, default="auto")
    p.add_argument("--gpus-per-node", "-g", type=int, default=0, metavar="G", help="GPUs per pod (default 0)")
    p.add_argument("--cpu", metavar="Q", help="CPU request per pod, e.g. 4 or 500m")
    p.add_argument("--memory", metavar="Q", help="memory request and limit per pod, e.g. 16Gi")
    add_env(p)
    p.add_argument(
        "--secret-env",
        action="append",
        metavar="NAME=SECRET:KEY",
        help="variable NAME from key KEY of Kubernetes secret SECRET (repeatable; never a value)",
    )
    p.add_argument(
        "--volume",
        action="append",
        metavar="CLAIM:/PATH[:ro]",
        help="mount PersistentVolumeClaim CLAIM at /PATH on every pod: data, checkpoints (repeatable)",
    )
    add_max_restarts(p, restarts_help)


def k8s_parser() -> argparse.ArgumentParser:
    p = parser(
        "shoal launch k8s",
        "Render COMMAND as a Kubeflow PyTorchJob (training-operator), TrainJob (Trainer v2, "
        "torch-distributed runtime) or MPIJob (MPI operator) and apply it with kubectl; without "
        "kubectl, write it to a file and print the command that applies it. Every pod runs COMMAND "
        "directly: shoal reads what the operator gives the pod and starts its processes.",
        K8S_EXAMPLES,
    )
    p.add_argument("--kind", choices=KINDS, default="pytorchjob", help="the object to render (default pytorchjob)")
    _add_pod(
        p,
        nodes_help="pods (PyTorchJob, TrainJob) or MPIJob workers (default 1)",
        restarts_help="pod restarts (restartPolicy OnFailure) before the job fails (default 0; 10 for a "
        "`shoal train --fault-tolerance` PyTorchJob, whose lost groups come back as restarted pods; a "
        "TrainJob's runtime sets its own)",
    )
    p.add_argument("--namespace", "-n", default="default", help="Kubernetes namespace (default default)")
    p.add_argument("--shm-size", metavar="Q", help="size limit of the memory-backed /dev/shm, e.g. 8Gi")
    p.add_argument("--elastic", metavar="MIN:MAX", help="PyTorchJob: elastic between MIN and MAX pods")
    p.add_argument(
        "--grace-period",
        type=int,
        metavar="S",
        help="terminationGracePeriodSeconds (default: the command's --preempt-grace + 5, else 30)",
    )
    p.add_argument("--master-port", type=int, metavar="PORT", help="rendezvous port (default 29500)")
    p.add_argument("--runtime", default="torch-distributed", help="TrainJob: the ClusterTrainingRuntime to use")
    p.add_argument("--file", metavar="PATH", help="where to write the manifest without kubectl (default NAME.yaml)")
    add_command(p, dry_run="print the YAML, apply nothing")
    # Unset: 0, or for a `shoal train --fault-tolerance` command enough for its pods to come back.
    p.set_defaults(max_restarts=None)
    return p


def runai_parser() -> argparse.ArgumentParser:
    from shoal.jobs.kubernetes.runai import RUNAI_CLIS

    p = parser(
        "shoal launch runai",
        "Print the Run:ai CLI command that submits COMMAND as a distributed PyTorch job (one master "
        "and NODES-1 workers), for each CLI generation or the one --cli names.",
    )
    p.add_argument("--cli", choices=RUNAI_CLIS, help="one CLI generation (default: all three)")
    p.add_argument("--project", "-p", help="Run:ai project (default: the CLI's configured one)")
    _add_pod(p, nodes_help="pods: the master and NODES-1 workers (default 2)")
    p.set_defaults(nodes=2)
    add_command(p, dry_run="same as without it: the commands are printed, never run")
    return p


def image_parser() -> argparse.ArgumentParser:
    from shoal.jobs.kubernetes.image import DEFAULT_BASE_IMAGE

    p = parser(
        "shoal launch image",
        "Write a Dockerfile and a .dockerignore for the job's image: a PyTorch base image, shoal and "
        "your requirements installed, this directory copied, shoal as the entry point. The files are "
        "always ./Dockerfile and ./.dockerignore (docker build reads them from the build context); "
        "files of those names that shoal did not write are never replaced.",
    )
    p.add_argument("--base-image", default=DEFAULT_BASE_IMAGE, help=f"base image (default {DEFAULT_BASE_IMAGE})")
    p.add_argument("--requirements", metavar="FILE", help="a pip requirements file to install (relative path)")
    p.add_argument("--mpi", action="store_true", help="add Open MPI and openssh-server (for an MPIJob)")
    p.add_argument(
        "--shoal-requirement",
        metavar="SPEC",
        help="how pip installs shoal (default: the shoal that runs here: its checkout when it is this directory, "
        "else a wheel built from it into this directory; the file or index it was installed from)",
    )
    p.add_argument("--image", help="the tag to build, for the printed docker commands")
    p.add_argument(
        "--horovod-shim",
        action="store_true",
        help="let a script keep `import horovod...` in every container (ENV SHOAL_HOROVOD_SHIM=1; an MPIJob's "
        "ranks need `shoal launch k8s --horovod-shim` too: sshd does not hand them the image's ENV)",
    )
    add_command(p, dry_run="print both files, write nothing")
    p.error = _image_option_error(p.error)  # type: ignore[method-assign]
    return p


def _image_option_error(error):
    """``--file``/``--output`` (which ``k8s`` and ``slurm`` have) get a hint that says why not here."""

    def image_error(message: str):
        if message.startswith("unrecognized arguments") and any(
            word.split("=")[0] in ("--file", "-f", "--output", "-o") for word in message.split(": ", 1)[-1].split()
        ):
            raise ShoalError(
                message.replace("unrecognized arguments", "no such option"),
                "the files are always ./Dockerfile and ./.dockerignore: run shoal launch image in the directory "
                "to build from, or print them with --dry-run",
            )
        error(message)

    return image_error


# ---- runners ---------------------------------------------------------------------------------


def _spec(args: argparse.Namespace, **pod_extra):
    """The job and its pods from the flags: ``(JobSpec, PodOptions)``."""
    from shoal.jobs.kubernetes.options import PodOptions, parse_secret_env, parse_volumes, pod_env
    from shoal.jobs.spec import JobSpec, parse_env, parse_nproc

    pods = PodOptions(
        image=args.image,
        cpu=args.cpu,
        memory=args.memory,
        secret_env=parse_secret_env(args.secret_env),
        volumes=parse_volumes(args.volume),
        **pod_extra,
    )
    spec = JobSpec(
        command=args.command,
        job_name=args.name,
        nodes=args.nodes,
        nproc=parse_nproc(args.nproc),
        gpus_per_node=args.gpus_per_node,
        max_restarts=args.max_restarts,
        master_port=getattr(args, "master_port", None),
        env=tuple(pod_env(parse_env(env_items(args)), os.environ)),
    )
    return spec, pods


def run_k8s(args: argparse.Namespace) -> int:
    from shoal.jobs.kubernetes.fault_tolerance import MIN_RESTARTS
    from shoal.jobs.kubernetes.manifest import MANIFEST_MARKER, kubectl_apply, to_yaml_all
    from shoal.jobs.kubernetes.options import parse_elastic
    from shoal.jobs.spec import fault_tolerant, parse_env

    if args.max_restarts is None:  # a TrainJob's pod restarts are its runtime's to bound
        ft = args.kind == "pytorchjob" and args.command and fault_tolerant(args.command)
        args.max_restarts = MIN_RESTARTS if ft else 0
    spec, pods = _spec(
        args,
        namespace=args.namespace,
        shm_size=args.shm_size,
        elastic=parse_elastic(args.elastic),
        grace_period_s=args.grace_period,
    )
    if pods.elastic is not None and args.kind != "pytorchjob":
        raise ShoalError(f"--elastic: only a PyTorchJob is elastic, not a {args.kind}", "use --kind pytorchjob")
    objects = _render(args.kind, spec, pods, args.runtime)
    warn_missing_script(args.command, where="the image")
    warn_local_paths(parse_env(args.env), os.environ, where="the pods")
    manifest = objects[-1]  # the job; a fault-tolerant one's lighthouse comes before it
    kind, name = manifest["kind"], spec.job_name
    ns = pods.namespace
    file = args.file or f"{name}.yaml"
    note = f"Apply: kubectl apply -f {file}\nWatch: kubectl get pods -n {ns}"
    if len(objects) > 1:
        note += f"\nDelete: kubectl delete -f {file} (the lighthouse's Deployment outlives the job)"
    text = to_yaml_all(objects, note)
    if args.dry_run:
        sys.stdout.write(text)
        return 0
    if shutil.which("kubectl"):
        out = kubectl_apply(text, f"{kind} {name}")
        out = "; ".join(out.splitlines())  # one line per object applied
        announce(f"{out or 'applied'}; watch it with `kubectl get {kind.lower()} {name} -n {ns}`")
        return 0
    write_rendered(file, text, MANIFEST_MARKER, what="shoal launch k8s")
    announce(f"kubectl is not on PATH: wrote {file}; apply it where kubectl reaches the cluster with:")
    print(f"kubectl apply -f {file}", flush=True)
    return 0


def _render(kind: str, spec, pods, runtime: str) -> list[dict]:
    """The objects to apply, in order (the job last)."""
    if kind == "trainjob":
        from shoal.jobs.kubernetes import trainjob

        return trainjob.render_objects(spec, pods, runtime)
    if kind == "mpijob":
        from shoal.jobs.kubernetes.mpijob import render_mpijob

        return [render_mpijob(spec, pods)]
    from shoal.jobs.kubernetes.pytorchjob import render_objects

    return render_objects(spec, pods)


def run_runai(args: argparse.Namespace) -> int:
    from shoal.jobs.kubernetes.runai import RUNAI_CLIS, RUNAI_LABELS, render_runai
    from shoal.jobs.spec import parse_env

    spec, pods = _spec(args)
    clis = [args.cli] if args.cli else list(RUNAI_CLIS)
    rendered = [(cli, render_runai(spec, pods, cli, args.project)) for cli in clis]  # all checked before printing
    warn_missing_script(args.command, where="the image")
    warn_local_paths(parse_env(args.env), os.environ, where="the pods")
    for cli, argv in rendered:
        if len(rendered) > 1:
            print(f"# {RUNAI_LABELS[cli]}:")
        print(shell(argv))
    return 0


def run_image(args: argparse.Namespace) -> int:
    from shoal.jobs.kubernetes.image import IMAGE_MARKER, build_wheel, render_dockerfile, render_dockerignore
    from shoal.jobs.spec import JobSpec, parse_env

    spec = JobSpec(command=args.command, env=parse_env(env_items(args)))
    source = _image_sources(args)

    def dockerfile(requirement: str) -> str:
        return render_dockerfile(
            spec,
            base_image=args.base_image,
            shoal_requirement=requirement,
            requirements=args.requirements,
            mpi=args.mpi,
            notes=source.notes,
        )

    text = dockerfile(source.requirement)
    ignore = render_dockerignore()
    if not args.dry_run:
        if args.requirements and not os.path.isfile(args.requirements):
            raise ShoalError(
                f"--requirements {args.requirements}: no such file", "give the path of a requirements file"
            )
        for path in ("Dockerfile", ".dockerignore"):  # check both before writing either
            _check_image_file(path, IMAGE_MARKER)
    warn_missing_script(args.command, where="the image")  # warnings once the input is known to be good
    for note in source.notes:
        announce(f"warning: {note}")
    if args.dry_run:
        if source.checkout:
            announce(
                f"the image installs {source.requirement}, a wheel of the checkout shoal runs from "
                f"({source.checkout}), built into this directory when the files are written"
            )
        sys.stdout.write(f"# ---- Dockerfile\n{text}# ---- .dockerignore\n{ignore}")
        return 0
    if source.checkout:
        built = build_wheel(source.checkout, os.getcwd())
        announce(f"built {built} from the checkout shoal runs from ({source.checkout}); the image installs it")
        text = dockerfile(built) if built != source.requirement else text
    elif source.copy:
        shutil.copyfile(source.copy, os.path.basename(source.copy))
        announce(f"copied {source.copy}, the file shoal was installed from, here; the image installs it")
    write_rendered("Dockerfile", text, IMAGE_MARKER, what="shoal launch image")
    write_rendered(".dockerignore", ignore, IMAGE_MARKER, what="shoal launch image")
    tag = args.image or "REGISTRY/NAME:TAG"
    announce("wrote Dockerfile and .dockerignore; build and push the image with:")
    print(f"docker build -t {tag} . && docker push {tag}", flush=True)
    return 0


@dataclass(frozen=True)
class _ImageSource:
    """How the image installs shoal: ``requirement`` (what pip installs in the Dockerfile); a
    ``checkout`` to build a wheel of into the build context first, or a file to ``copy`` there;
    ``notes``: what the image assumes that differs from this machine."""

    requirement: str
    checkout: str = ""
    copy: str = ""
    notes: tuple[str, ...] = ()


def _image_sources(args: argparse.Namespace) -> _ImageSource:
    """How the image installs shoal: the shoal this machine runs, by default.

    ``--shoal-requirement`` as given; else, shoal installed from a checkout (``pip install -e .``):
    the checkout itself when it is this directory (the build context), else a wheel built from it
    into this directory; shoal installed from a wheel or sdist file: that file, copied here; shoal
    installed from a package index: the same version from it. A ``pytorch/pytorch`` base image's
    torch is compared with the torch installed here."""
    import json
    from importlib.metadata import PackageNotFoundError, distribution, version
    from urllib.parse import unquote, urlparse

    from shoal.jobs.kubernetes.image import base_image_torch, wheel_name

    notes = []
    source = _ImageSource(requirement=args.shoal_requirement or f"shoal=={_version()}")
    if args.shoal_requirement is None:
        try:
            origin = json.loads(distribution("shoal").read_text("direct_url.json") or "{}")
        except (PackageNotFoundError, ValueError):
            origin = {}
        url = origin.get("url", "")
        path = unquote(urlparse(url).path) if url.startswith("file:") else ""
        if "dir_info" in origin and path:
            if os.path.realpath(path) == os.path.realpath(os.getcwd()):
                source = _ImageSource(requirement=".")
            else:
                source = _ImageSource(requirement=wheel_name(_version()), checkout=path)
        elif "archive_info" in origin and path and os.path.isfile(path):
            name = os.path.basename(path)
            here = os.path.realpath(path) == os.path.realpath(name)
            source = _ImageSource(requirement=name, copy="" if here else path)
        elif url and not path:  # installed from a URL: the image installs from it too
            source = _ImageSource(requirement=url)
    ours = base_image_torch(args.base_image)
    try:
        here = version("torch").split("+", 1)[0]
    except PackageNotFoundError:
        here = None
    if ours and here and ours != here:
        notes.append(
            f"the base image holds torch {ours}, this machine runs torch {here}: pass --base-image with a "
            f"pytorch/pytorch:{here} tag to train with the same torch"
        )
    return dataclasses.replace(source, notes=tuple(notes))


def _check_image_file(path: str, marker: str) -> None:
    """Raise unless ``path`` may be (re)written: absent, or a file ``shoal launch image`` wrote.

    The names are fixed (``docker build`` reads ``Dockerfile`` and ``.dockerignore`` from the build
    context), so the hint offers what the user can do: move theirs away, or print ours and merge.
    """
    hint = f"move your {path} away (e.g. `mv {path} {path}.mine`), or print shoal's files with --dry-run and merge them"
    if os.path.isdir(path):
        raise ShoalError(f"{path} is a directory here, so shoal launch image cannot write its {path}", hint)
    try:
        check_replaceable(path, marker, what="shoal launch image")
    except ShoalError as err:
        raise ShoalError(err.message, hint) from None


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("shoal")
    except PackageNotFoundError:  # pragma: no cover - a source tree without an install
        return "0.1.0"
