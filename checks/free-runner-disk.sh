#!/usr/bin/env bash
# Make room on a GitHub-hosted runner for the Serving stack's images, then check there is enough.
#
#   checks/free-runner-disk.sh [REQUIRED_GB]      # default 45
#
# A standard Linux runner guarantees 14 GB of SSD ("Supported runners and hardware resources",
# https://docs.github.com/en/actions/reference/runners/github-hosted-runners); `make deploy`
# builds and pushes three images one at a time (cdk publish-assets --concurrency 1): the LLM image
# on vllm/vllm-openai (about 12 GB to pull, more unpacked), the quantization job on CUDA torch
# wheels, the intent classifier on a Neuron image. Docker keeps each until the job ends. The
# runner image carries toolchains this job never uses (Android SDK, .NET, Haskell, CodeQL,
# Swift, ...); removing them frees tens of GB. Then the free space of the file system holding
# Docker's data root must be at least REQUIRED_GB (docs/design-decisions.md#runner-disk), or the
# job stops here, before any build, naming the fix.
#
# Settings for tests: RUNNER_CLEANUP_PATHS (space-separated), DOCKER_DATA_ROOT, SUDO.
set -euo pipefail

required_gb="${1:-45}"
if ! [[ "$required_gb" =~ ^[0-9]+$ ]]; then
    echo "free-runner-disk: REQUIRED_GB '$required_gb' is not accepted: a whole number of GB" >&2
    exit 2
fi
cleanup_paths="${RUNNER_CLEANUP_PATHS:-/usr/local/lib/android /usr/share/dotnet /opt/ghc \
/usr/local/.ghcup /opt/hostedtoolcache/CodeQL /usr/share/swift /usr/local/share/boost \
/usr/local/share/powershell /usr/local/julia* /opt/microsoft/msedge /opt/google/chrome}"
sudo_cmd="${SUDO-sudo}"

free_gb() {
    df --output=avail -B1G "$1" | tail -n 1 | tr -d ' '
}

data_root="${DOCKER_DATA_ROOT:-}"
if [[ -z "$data_root" ]]; then
    data_root="$(docker info --format '{{.DockerRootDir}}' 2>/dev/null || echo /var/lib/docker)"
fi
probe="$data_root"
while [[ ! -e "$probe" ]]; do probe="$(dirname "$probe")"; done

before="$(free_gb "$probe")"
echo "free-runner-disk: ${before} GB free for ${data_root} before cleanup"
for path in $cleanup_paths; do
    if [[ -e "$path" ]]; then
        $sudo_cmd rm -rf -- "$path"
        echo "free-runner-disk: removed ${path}"
    fi
done
if command -v docker >/dev/null 2>&1 && [[ -z "${DOCKER_DATA_ROOT:-}" ]]; then
    docker image prune --all --force >/dev/null
fi
after="$(free_gb "$probe")"
echo "free-runner-disk: ${after} GB free for ${data_root} (${required_gb} GB needed)"
if (( after < required_gb )); then
    echo "free-runner-disk: ${after} GB free for ${data_root}, ${required_gb} GB needed to build" \
         "the Serving stack's images: run the deploy job on a larger runner (runs-on in" \
         ".github/workflows/deploy-environment.yml; GitHub's larger runners have more disk)" >&2
    exit 1
fi
