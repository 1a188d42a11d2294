#!/usr/bin/env bash
# Does the fast tier still catch a fixed defect? For each commit given, in a scratch worktree
# of HEAD: undo the commit's change outside tests/, docs/, benchmarks/ and *.md (the fix), then
# run the fast tier's selection of the test files that commit touched. "caught" is a failing
# run; "missed" a passing one, which means the fast tier lost that defect's test.
#   bash tests/tools/revert_check.sh 418b9a0 4c730b3 ...
set -uo pipefail
root=$(git rev-parse --show-toplevel)
python=${PYTHON:-$root/.venv/bin/python}
scratch=$(mktemp -d /tmp/vime-revert-XXXXXX)
git -C "$root" worktree add -q --detach "$scratch/tree" HEAD
trap 'git -C "$root" worktree remove --force "$scratch/tree"; rm -rf "$scratch"' EXIT
for commit in "$@"; do
  git -C "$scratch/tree" reset -q --hard HEAD
  git -C "$scratch/tree" clean -qfd
  git -C "$root" show --format= "$commit" -- . ':(exclude)tests' ':(exclude)docs' \
      ':(exclude)benchmarks' ':(exclude)*.md' > "$scratch/fix.diff"
  mapfile -t tests < <(git -C "$root" show --format= --name-only "$commit" -- 'tests/**/test_*.py' 'tests/test_*.py' |
                       while read -r f; do [ -f "$scratch/tree/$f" ] && echo "$f"; done)
  # a fix whose test is a golden file is caught by the golden test
  if git -C "$root" show --format= --name-only "$commit" | grep -q '^tests/golden/'; then
    tests+=(tests/test_golden.py)
  fi
  title=$(git -C "$root" log -1 --format=%s "$commit" | cut -c1-80)
  if [ ! -s "$scratch/fix.diff" ] || [ ${#tests[@]} -eq 0 ]; then
    echo "$commit  skipped (no fix outside tests, or no test file left)  $title"; continue
  fi
  if ! git -C "$scratch/tree" apply -R --3way "$scratch/fix.diff" >/dev/null 2>&1; then
    echo "$commit  skipped (the fix no longer undoes cleanly)  $title"; continue
  fi
  start=$(date +%s)
  (cd "$scratch/tree" && PYTHONPATH="$scratch/tree" timeout 900 "$python" -m pytest -q -x \
     -p no:cacheprovider -m "not slow and not network and not slurm" "${tests[@]}" \
     > "$scratch/$commit.log" 2>&1)
  rc=$?
  verdict=$([ $rc -eq 1 ] && echo caught || echo "missed (pytest exit $rc)")
  echo "$commit  $verdict in $(( $(date +%s) - start )) s: ${tests[*]}  |  $title"
  [ $rc -eq 1 ] && grep -m1 -E "^(FAILED|ERROR)" "$scratch/$commit.log" | cut -c1-160 | sed 's/^/      /'
done
