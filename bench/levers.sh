#!/usr/bin/env bash
# Two levers of docs/benchmarks.md, measured on one provisioned sandbox
# host, RUNS times each way, alternating; each run prints its wall time, the controller's CPU
# (ansible-playbook and everything it waits for: its workers and ssh) and the recap's counts.
#
#   bench/levers.sh mitogen [RUNS] [HOST]    a no-op site.yml with Ansible's default strategy
#                                            (linear) and with mitogen's (mitogen_linear)
#   bench/levers.sh installer [RUNS] [HOST]  a new environment (env.yml; the stack's torch with one
#                                            extra package, a new pin each run so that each run
#                                            builds) with pip and with uv, each with its warm cache
#   bench/levers.sh commit REV [RUNS] [HOST] a no-op site.yml with the code of REV (a git worktree)
#                                            and with this working tree's: a change's before/after
#   defaults: 3 runs, host sb1 of inventory/sandbox
#
# Needs a provisioned sandbox (./scripts/demo leaves one up). mitogen is an option gpuenv documents,
# not one of its dependencies: this installs mitogen 0.3.54 (hash-pinned) into a temporary
# directory for the runs, never into .venv.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
lever=${1:-}
rev=""
if [ "$lever" = commit ]; then
  rev=${2:-}
  [ -n "$rev" ] || { echo "levers.sh: commit needs a revision (a commit, a tag or a branch)" >&2; exit 2; }
  shift
fi
runs=${2:-3}
host=${3:-sb1}
case "$lever" in
  mitogen | installer | commit) ;;
  *) sed -n '5,13p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
cd "$root"
export PATH="$root/.venv/bin:$PATH" ANSIBLE_NOCOLOR=1
[ -f inventory/sandbox/hosts.yml ] || { echo "levers.sh: no sandbox is up; run ./scripts/demo first" >&2; exit 1; }

dir=$(mktemp -d /tmp/gpuenv-levers.XXXXXX)
trap 'rm -rf "$dir"; [ -z "$rev" ] || git -C "$root" worktree prune' EXIT

one() {  # NAME PLAYBOOK [ENV...] -- [ARGS...]: one run, its figures on one line
  local name=$1 playbook=$2
  shift 2
  local envs=() tree=$root
  while [ $# -gt 0 ] && [ "$1" != -- ]; do
    case "$1" in TREE=*) tree=${1#TREE=} ;; *) envs+=("$1") ;; esac
    shift
  done
  [ "${1:-}" = -- ] && shift
  # Another tree's playbooks, roles and plugins (ansible.cfg), and its gpuenv for the filters.
  (cd "$tree" && env ANSIBLE_CONFIG="$tree/ansible.cfg" PYTHONPATH="$tree" "${envs[@]}" \
    /usr/bin/time -f '%e %U %S' -o "$dir/time" \
    ansible-playbook -i "$root/inventory/sandbox" "playbooks/$playbook" --limit "$host" "$@") > "$dir/out" 2>&1 \
    || { tail -40 "$dir/out"; echo "levers.sh: the $name run failed (above)" >&2; exit 1; }
  read -r wall user sys < "$dir/time"
  printf '%-16s wall %6.1f s  controller CPU %5.1f s  %s\n' "$name" "$wall" \
    "$(awk -v u="$user" -v s="$sys" 'BEGIN { print u + s }')" \
    "$(grep -E "^$host +:" "$dir/out" | tail -1 | grep -oE '(ok|changed|skipped)=[0-9]+' | tr '\n' ' ')"
}

if [ "$lever" = installer ]; then
  echo "a new environment on $host with pip and with uv, $runs runs each"
  # Each run pins another release of a small package, so that its environment is a new one; the
  # warm-ups fill each installer's cache on the host with the stack's torch and its companions.
  pip_pins=(1.17.0 1.16.0 1.15.0 1.14.0)
  uv_pins=(1.11.0 1.10.0 1.9.0 1.8.0)
  [ "$runs" -le 4 ] || { echo "levers.sh: installer: at most 4 runs" >&2; exit 2; }
  new_env() { printf '{"pytorch_env_installer": "%s", "pytorch_env_packages": ["six==%s"]}' "$1" "$2"; }
  one "warm-up pip" env.yml -- -e "$(new_env pip 1.13.0)"
  one "warm-up uv" env.yml -- -e "$(new_env uv 1.12.0)"
  for i in $(seq 0 $((runs - 1))); do
    one pip env.yml -- -e "$(new_env pip "${pip_pins[$i]}")"
    one uv env.yml -- -e "$(new_env uv "${uv_pins[$i]}")"
  done
  exit 0
fi

if [ "$lever" = commit ]; then
  git worktree add --quiet --detach "$dir/before" "$rev" \
    || { echo "levers.sh: git cannot check out $rev" >&2; exit 1; }
  echo "no-op site.yml on $host with $rev ($(git -C "$dir/before" rev-parse --short HEAD)) and with this tree, $runs runs each"
  # A settling run each: the newer code may write its files once, in its own way.
  one "settle $rev" site.yml TREE="$dir/before" >/dev/null
  one "settle tree" site.yml >/dev/null
  for i in $(seq "$runs"); do
    one "$rev" site.yml TREE="$dir/before"
    one tree site.yml
  done
  exit 0
fi

printf 'mitogen==0.3.54 --hash=sha256:ed7f209225069cbbe0c2f25ec5e4cd88e43bcb7ae0d55c61850083c96b81591d\n' > "$dir/req.txt"
.venv/bin/pip install --quiet --no-deps --require-hashes --target "$dir/lib" -r "$dir/req.txt" \
  || { echo "levers.sh: pip could not install mitogen 0.3.54 from PyPI (see above)" >&2; exit 1; }
strategies="$dir/lib/ansible_mitogen/plugins/strategy"

echo "no-op site.yml on $host, $runs runs each (ansible-core $(python -c 'import ansible; print(ansible.__version__)'))"
for i in $(seq "$runs"); do
  one linear site.yml
  one mitogen_linear site.yml PYTHONPATH="$dir/lib" ANSIBLE_STRATEGY_PLUGINS="$strategies" ANSIBLE_STRATEGY=mitogen_linear
done
