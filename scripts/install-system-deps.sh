#!/usr/bin/env bash
# System packages the cluster tests use: Open MPI (mpirun), Slurm (slurmctld, slurmd, srun, sbatch)
# with munge, iproute2 (`ip`, for the network-namespace "nodes"), OpenSSH's server and client (real
# SSH between namespace "pods") and nftables (a firewall rule inside a namespace, for shoal doctor).
#
# Idempotent and fast when everything is there: apt-get runs only for what is missing. Without root
# or without apt-get it says what it skips and exits 0; the tests that need those programs then skip
# with a reason. Under CI (CI=true) it exits 1 instead: a green CI run must not be one whose
# multi-node tests all skipped. If apt-get itself fails it says so and exits 1. `make test` runs it
# before pytest.
# Versions seen on Debian 12: Open MPI 4.1.4, Slurm 22.05, munge 0.5.15.
#
# Usage: scripts/install-system-deps.sh        (SHOAL_SKIP_SYSTEM_DEPS=1 skips it entirely)
set -euo pipefail

if [[ "${SHOAL_SKIP_SYSTEM_DEPS:-}" == 1 ]]; then
    echo "install-system-deps: SHOAL_SKIP_SYSTEM_DEPS=1: skipped"
    exit 0
fi

# program -> package providing it (the packages are installed with --no-install-recommends).
declare -A PACKAGE_OF=(
    [mpirun]=openmpi-bin
    [slurmctld]=slurmctld
    [slurmd]=slurmd
    [srun]=slurm-client
    [sbatch]=slurm-client
    [scontrol]=slurm-client
    [munged]=munge
    [ip]=iproute2
    [sshd]=openssh-server
    [ssh]=openssh-client
    [ssh-keygen]=openssh-client
    [nft]=nftables
)

have() { command -v "$1" >/dev/null 2>&1 || [[ -x "/usr/sbin/$1" || -x "/sbin/$1" ]]; }

missing=()
for program in mpirun slurmctld slurmd srun sbatch scontrol munged ip sshd ssh ssh-keygen nft; do
    if ! have "$program"; then
        package=${PACKAGE_OF[$program]}
        [[ " ${missing[*]-} " == *" $package "* ]] || missing+=("$package")
    fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
    echo "install-system-deps: Open MPI, Slurm, munge, iproute2, OpenSSH and nftables already installed"
    exit 0
fi
cannot_install() {
    if [[ "${CI:-}" == true ]]; then
        echo "install-system-deps: $1: cannot install ${missing[*]}, which the tests need under CI" >&2
        echo "HINT: run CI as root on Debian/Ubuntu (apt-get), or install the packages into its image" >&2
        exit 1
    fi
    echo "install-system-deps: $1: skipped installing ${missing[*]} (the tests needing them will skip)"
    exit 0
}
[[ $(id -u) -eq 0 ]] || cannot_install "not root"
have apt-get || cannot_install "no apt-get"

echo "install-system-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# No systemd here: the packages' service start-up is refused or fails harmlessly; the tests start
# the daemons they need by hand, with their own configuration.
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }; then
    echo "install-system-deps: apt-get could not install ${missing[*]}" >&2
    echo "HINT: fix apt (network, sources), or run the tests without them: SHOAL_SKIP_SYSTEM_DEPS=1 make test" >&2
    exit 1
fi
echo "install-system-deps: done"
