#!/usr/bin/env bash
# On a GPU machine: a base version of the code and HEAD side by side, the CUDA tests, and the GPU preset's BLEU.
#
# A GPU machine (../shared/docs/gpu.md) has torch with CUDA but no package index and no ../shared: prepare here,
# run there, one script each way.
#
#   bash scripts/gpu_check.sh prepare [BASE]   # here: .device/ (git-ignored) with wheels, data and its cache
#   bash scripts/gpu_check.sh dryrun           # here: the carried wheels installed offline, cuda tests collected
#   bash scripts/gpu_check.sh run [STAGE ...]  # there, from the tree's root: writes $OUT/*.json (or .device/out)
#
# prepare builds wheels of a base version (BASE, default 4d8cc21: the code before the per-device step) and of
# HEAD (commit first: the wheel is built from HEAD, not from the working tree), downloads hydra-core, omegaconf
# and antlr4 (a pure-Python wheel of each), copies the Multi30k files and prepares their SentencePiece cache, so
# that neither code trains a tokenizer there (the cache is the same for both: nmt/data.py's key).
# Everything goes under .device/ (a few MB): hand it over with the device tool's carry [".device"].
#
# run's stages, in this order by default, each writing its files as soon as it has them (so a run cut short by
# its time limit keeps what it measured); every stage finishes well inside one 10-minute call, and no call of
# one or two stages writes more than the 8 files the device tool brings back:
#   steps  scripts/gpu_steps.py with the base version, then HEAD's, at 2,000 and 16,000 tokens (about 4 minutes):
#          steps_base.json, steps_new.json (sentences/s, median ms a step after the warm-up, kernel launches,
#          GPU-busy fraction, memory), their logs in steps.txt
#   tests  pytest -m cuda tests/test_cuda.py with HEAD's code, the project's pytest options left out (the GPU
#          machine's pytest may lack xdist): sync debug mode "error" around 50 steps (about 2 minutes): tests.txt
#   bleu   scripts/benchmark.py with experiment=multi30k_deen_gpu (150 s of training, greedy and beam 5 on
#          test2016) with HEAD's code (about 5 minutes): bleu_gpu_preset.json, bleu.txt
#   threads  the same machine's CPU (16 cores there, the only many-core CPU at hand): scripts/gpu_steps.py
#          --device cpu at 1, 2, 4, 8 and 16 threads, fp32 and bf16, 2,000 tokens, 5 steps each (about 6
#          minutes; THREADS="1 2" and AMPS=off choose fewer): cpu_threads.json, its log in threads.txt
# Besides: gpu.txt (nvidia-smi) and failures.txt (a stage that fails is named there and the next one runs).
# With the device tool (15 minutes of device time, the machine's start included): first
# "bash scripts/gpu_check.sh run steps tests", carry [".device"], timeout_s 480; then, if time is left,
# "bash scripts/gpu_check.sh run bleu" (timeout_s 420). Commit the JSON under docs/benchmark/ (device: cuda).
set -euo pipefail
cd "$(dirname "$0")/.."

prepare() {
    local base=${1:-4d8cc21}
    local dev=.device
    local exclude
    exclude=$(git rev-parse --git-path info/exclude)
    grep -qx '/.device/' "$exclude" 2>/dev/null || echo /.device/ >>"$exclude"
    rm -rf "$dev" && mkdir -p "$dev/whl/deps" "$dev/whl/base" "$dev/whl/new" "$dev/data" "$dev/src"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$dev/whl/deps" hydra-core==1.3.2 omegaconf==2.3.0
    python3 -m pip wheel -q --no-deps -w "$dev/whl/deps" antlr4-python3-runtime==4.9.3 # an sdist only
    for name in base new; do
        local rev=$base
        [ "$name" = new ] && rev=HEAD
        mkdir -p "$dev/src/$name" && git archive "$rev" | tar -x -C "$dev/src/$name"
        python3 -m pip wheel -q --no-deps -w "$dev/whl/$name" "$dev/src/$name"
        git rev-parse "$rev" >"$dev/whl/$name/COMMIT"
    done
    rm -rf "$dev/src"
    cp -r ../shared/data/multi30k "$dev/data/"
    python3 -m nmt.cli.prepare experiment=multi30k_deen data.root="$dev/data/multi30k" paths.data_dir="$dev/data"
    du -sh "$dev"
    echo "prepared: base $(cat "$dev/whl/base/COMMIT"), new $(cat "$dev/whl/new/COMMIT")"
}

install() { # $1: base or new -> /tmp/site-$1, hydra and friends in /tmp/site-deps
    [ -d /tmp/site-deps ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-deps \
        .device/whl/deps/*.whl
    [ -d "/tmp/site-$1" ] || python3 -m pip install -q --no-index --no-deps --no-compile --target "/tmp/site-$1" \
        .device/whl/"$1"/*.whl
}

# pytest without the project's addopts (-n 2 and options of the pytest-xdist version CI installs)
pytest_opts=(-q -rs -p no:cacheprovider -o addopts=)

dryrun() { # here: what `run` installs there, from the carried wheels alone, into a clean target
    local site
    site=$(mktemp -d)
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" .device/whl/deps/*.whl \
        .device/whl/new/*.whl
    PYTHONPATH=$site python3 -P -c "import hydra, omegaconf, nmt; assert nmt.__file__.startswith('$site'), nmt.__file__"
    PYTHONPATH=$site python3 -P -m pytest "${pytest_opts[@]}" --collect-only -m cuda tests/test_cuda.py | tail -n 3
    rm -rf "$site"
    echo "dry run: the wheels install offline and the cuda tests collect"
}

run() {
    local out=${OUT:-.device/out}
    local stages=("$@")
    [ ${#stages[@]} -gt 0 ] || stages=(steps tests bleu)
    mkdir -p "$out"
    export PYTHONUNBUFFERED=1
    local data=(data.root=.device/data/multi30k paths.data_dir=.device/data)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$out/gpu.txt" 2>&1 || true
    for stage in "${stages[@]}"; do
        case $stage in
        steps)
            for name in base new; do
                install "$name"
                echo "== $name" >>"$out/steps.txt"
                PYTHONPATH=/tmp/site-$name:/tmp/site-deps python3 scripts/gpu_steps.py --label "$name" \
                    --out "$out/steps_$name.json" -- "${data[@]}" >>"$out/steps.txt" 2>&1 ||
                    echo "steps $name: exit $?" >>"$out/failures.txt"
                tail -n 5 "$out/steps.txt"
            done
            ;;
        tests)
            install new
            PYTHONPATH=/tmp/site-new:/tmp/site-deps python3 -P -m pytest "${pytest_opts[@]}" -m cuda tests/test_cuda.py \
                >"$out/tests.txt" 2>&1 || echo "tests: exit $?" >>"$out/failures.txt"
            tail -n 30 "$out/tests.txt"
            ;;
        bleu)
            install new
            PYTHONPATH=/tmp/site-new:/tmp/site-deps python3 scripts/benchmark.py --train-seconds 150 --threads 8 \
                --data .device/data/multi30k --out "$out/bleu_gpu_preset.json" device=cuda \
                experiment=multi30k_deen_gpu paths.data_dir=.device/data >"$out/bleu.txt" 2>&1 ||
                echo "bleu: exit $?" >>"$out/failures.txt"
            tail -n 40 "$out/bleu.txt"
            ;;
        threads)
            install new
            local parts
            parts=$(mktemp -d)
            for amp in ${AMPS:-off bf16}; do
                for n in ${THREADS:-1 2 4 8 16}; do
                    PYTHONPATH=/tmp/site-new:/tmp/site-deps python3 scripts/gpu_steps.py --label "cpu-$amp-$n" \
                        --device cpu --tokens 2000 --warmup 2 --steps 5 --out "$parts/$amp-$n.json" -- \
                        "${data[@]}" trainer.threads="$n" trainer.amp="$amp" >>"$out/threads.txt" 2>&1 ||
                        echo "threads $amp $n: exit $?" >>"$out/failures.txt"
                    python3 -c 'import json, os, sys
print(json.dumps({os.path.basename(p)[:-5]: json.load(open(p)) for p in sys.argv[1:]}, indent=1))' \
                        "$parts"/*.json >"$out/cpu_threads.json"
                done
            done
            tail -n 12 "$out/threads.txt"
            ;;
        *) echo "unknown stage $stage (steps, tests, bleu, threads)" >&2 && exit 2 ;;
        esac
    done
}

case ${1:-} in
prepare) shift && prepare "$@" ;;
dryrun) dryrun ;;
run) shift && run "$@" ;;
*) sed -n '2,30p' "$0" && exit 2 ;;
esac
