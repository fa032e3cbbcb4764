#!/usr/bin/env bash
# scripts/gpu_run.sh — one device call's measurements (docs/PERFORMANCE.md's method: build
# here with scripts/gpu_pack.sh, carry .cache/dev, run everything in one call, results
# under $OUT). Runs on the device machine from the repo root:
#
#   bash scripts/gpu_run.sh PACK [PACK_B]
#
# PACK (and PACK_B, a second build for an A/B) name .cache/dev/PACK.txz. Each arm is a
# (pack, environment) pair: with PACK_B the arms are A = PACK and B = PACK_B; with CONFIGS
# (';'-separated environment assignments, '' = none, e.g. CONFIGS=';ORCHID_X=1') each
# config is an arm of PACK (a field 'OTHER@ENV': an arm of pack OTHER). Arms alternate within
# every round, so drift hits them alike.
# ENV_A / ENV_B: environment assignments of the two packs' arms (e.g. ENV_B='ORCHID_X=1': an
# opt-in switch of the candidate build on, the base build as it runs by default).
#
# PHASES (default "tests contract batch"): any of
#   tests     test_cuda_ops, test_cuda_model (the carried tiny model), test_cuda_sample of
#             the last arm's pack (the candidate), with that arm's environment, each
#             killed after TEST_TIMEOUT seconds (default 240; exit 124 in the summary)
#   contract  orchid bench --synth 35b-a3b --backend cuda at CONTEXTS (default 512),
#             ROUNDS (default 2) rounds, every arm, fresh process each
#   batch     bench_batch_decode --ctx 512 --batches BATCHES (default 1,8,32,64), every arm,
#             ROUNDS rounds, BATCH_ARGS more flags (e.g. '--pack 8': the prompts prefilled
#             in packs, each timed, the last profiled) (TRACE=1: plus the trace build's
#             timelines, when packed)
#             (each run killed after BATCH_TIMEOUT seconds, default 180: a hung kernel)
#   serve     orchid synth 35b-a3b to /tmp/og_m once, then bench/serve_load.py (python3,
#             stdlib) against each arm's server: LEVELS (default 1,8,32,64), SERVE_SKIP
#             (default 'serial,replay'; '' = the issue's full set), SERVE_ARGS (more
#             serve_load flags, e.g. '--prompt-tokens 64'); SERVE_SHAPE / SERVE_BACKEND
#             (default 35b-a3b / cuda; tiny / cpu try the script without a GPU)
#   ncu       Nsight Compute on bench_batch_decode --ctx 512 --batches NCU_BATCH (default 64),
#             every arm: kernels matching NCU_KERNEL (a regex, default skinny_pipe), NCU_SKIP
#             (default 40: past the first forward) then NCU_COUNT (default 2) launches, the
#             sections NCU_SECTIONS (default SpeedOfLight MemoryWorkloadAnalysis WarpStateStats
#             SchedulerStats; '' = none), NCU_FLAGS more ncu flags (e.g. '--set full
#             --kernel-name-base mangled' with NCU_KERNEL='gemm_wg_kernelILi.ELb1': template
#             arguments in the regex, mangled — ncu's demangled names read "(bool)1"), NCU_ARGS
#             more bench flags (e.g. '--pack 8': prefill launches), NCU_CTX the bench's --ctx
#             (default 512); NCU_REPORT=1: also the raw metrics (stall samples, pipes) and the
#             per-SASS-instruction counts as CSV (res/ncu_ARM_raw.csv, _sass.csv); clocks
#             left alone, the program killed once they are taken, NCU_TIMEOUT (default 240) s;
#             the report's text into res/ncu_ARM.txt
#   ncuall    Nsight Compute on every launch of a stretch of the batched decode (bench_batch_decode
#             --ctx NCU_CTX --batches NCU_BATCH --pack 8 NCU_ARGS: the packs keep the prefill's
#             launches few), NCUALL_SKIP (default 8000: past the packs) then NCUALL_COUNT (default
#             200: 15 layers and an lm_head; 600 did not finish in 180 s) launches, a few
#             metrics each (duration, DRAM throughput and bytes, SM throughput, issue-slot
#             use, warps resident) as raw CSV into
#             res/ncuall_ARM.csv, and tools/ncu_table.py's table of it (res/ncuall_ARM.txt, its
#             first lines into the summary): which launches move their bytes near the DRAM's
#             rate and which are held by their own chains (docs/PERFORMANCE.md, session 43)
#   stream    bench_stream --mb STREAM_MB (default 256) of the first arm's pack: the DRAM read rate each way of loading
#             (per SM and all SMs) — the ceiling the weight-streaming kernels are held to
#   echo      bench/echo_check.py: /v1/completions echo + logprobs (the prompt's own logprobs) of
#             the last arm's server on the carried tiny model (--backend cuda) against the
#             same binary's CUDA server with ORCHID_NO_ROW_SCORES=1 (rows' logits scored on the
#             host), both in 16-row forwards (the same logits); ECHO_ARGS replaces those flags
#   echotime  bench/echo_time.py against each arm's server on the synthetic checkpoint: prompts
#             scored (echo + logprobs, max_tokens 0) one at a time and 8 at once, tok/s;
#             ECHOTIME_ARGS more flags (e.g. '--prompt-tokens 2048')
#   same      bench/serve_same.py (batch invariance end to end: requests together and alone,
#             bitwise) against each arm's server on the same synthetic checkpoint; SAME_ARGS
#             (e.g. '--lengths 17,600,4100 --max-seq 8192 --expect-same')
# Writes $OUT/summary.txt (one line a measurement) and $OUT/res.txz (every log and JSON).
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?gpu_run: OUT must name the results folder (the device tool sets it)}"
mkdir -p "$OUT"
PHASES=${PHASES:-tests contract batch}
CONTEXTS=${CONTEXTS:-512}
ROUNDS=${ROUNDS:-2}
BATCHES=${BATCHES:-1,8,32,64}
LEVELS=${LEVELS:-1,8,32,64}
SERVE_SKIP=${SERVE_SKIP-serial,replay}
SERVE_SHAPE=${SERVE_SHAPE:-35b-a3b}
SERVE_BACKEND=${SERVE_BACKEND:-cuda}
SERVE_ARGS=${SERVE_ARGS:-}
SAME_ARGS=${SAME_ARGS:-}
BATCH_ARGS=${BATCH_ARGS:-}
TEST_TIMEOUT=${TEST_TIMEOUT:-240} # seconds a GPU test binary may run (tests phase)
dev=.cache/dev
root=/tmp/og
res=$root/res
rm -rf "$res" # a warm machine keeps /tmp/og: one call's results only (the packs stay unpacked)
mkdir -p "$res"
summary=$OUT/summary.txt
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

unpack() { # $1: pack name → $root/$1 (again when the carried pack differs: a pack rebuilt under its name)
    [ -f "$dev/$1.txz" ] || { note "missing $dev/$1.txz"; return 1; }
    local sum
    sum=$(cksum <"$dev/$1.txz")
    [ -d "$root/$1" ] && [ "$(cat "$root/$1/.pack" 2>/dev/null)" = "$sum" ] && return 0
    rm -rf "${root:?}/$1"
    mkdir -p "$root/$1" && xz -dc "$dev/$1.txz" | tar -C "$root/$1" -xf - && echo "$sum" >"$root/$1/.pack"
}
for p in lib tok tiny; do unpack "$p" || exit 1; done
export LD_LIBRARY_PATH=$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ -f "$root/tiny/config.json" ] && export ORCHID_GPU_TINY=$root/tiny

packs=() envs=() names=()
if [ $# -ge 2 ]; then
    packs=("$1" "$2") envs=("${ENV_A:-}" "${ENV_B:-}") names=(A B)
else
    # every ';'-separated field an arm, empty ones too ('X=1;' is two arms: `read -a` dropped
    # a trailing empty field, and a session's A/B ran one arm)
    mapfile -d ';' -t cfgs < <(printf '%s;' "${CONFIGS:-}")
    # a field PACK@ENV is an arm of that pack (CONFIGS='s1@;s2@;s2@ORCHID_X=1': three arms, two packs)
    for i in "${!cfgs[@]}"; do
        f=${cfgs[$i]} p=$1
        if [[ $f =~ ^([A-Za-z0-9_.-]+)@(.*)$ ]]; then p=${BASH_REMATCH[1]} f=${BASH_REMATCH[2]}; fi
        packs+=("$p"); envs+=("$f"); names+=("c$i")
    done
fi
for p in "${packs[@]}"; do unpack "$p" || exit 1; done
for i in "${!packs[@]}"; do
    note "arm ${names[$i]}: pack ${packs[$i]} ($(head -1 "$root/${packs[$i]}/commit")) env '${envs[$i]}'"
done
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader >>"$summary" 2>/dev/null ||
    note "no nvidia-smi"

arm() { # $1: arm index, then the command (its binary relative to the pack): runs it with the arm's environment
    local i=$1
    shift
    env ${envs[$i]} "$@"
}

# The serve and same phases' checkpoint: SERVE_SHAPE written once to m by the first pack.
m=/tmp/og_m_$SERVE_SHAPE
synth_model() {
    [ -f "$m/config.json" ] && return 0
    "$root/${packs[0]}/bin/orchid" synth --out "$m" --shape "$SERVE_SHAPE" --tokenizer "$root/tok" --quiet \
        >"$res/synth.log" 2>&1 && return 0
    note "synth failed: $(tail -2 "$res/synth.log")"
    return 1
}

last=$((${#packs[@]} - 1))
for phase in $PHASES; do
    case $phase in
    tests)
        bin=$root/${packs[$last]}/bin
        for t in test_cuda_ops test_cuda_model test_cuda_sample; do
            arm "$last" timeout "$TEST_TIMEOUT" "$bin/$t" >"$res/$t.log" 2>&1
            rc=$? # 124: killed at TEST_TIMEOUT (a hung kernel must not take the whole call)
            note "$t (${names[$last]}): $(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$res/$t.log" | tail -1) (exit $rc)"
            grep -m5 FAIL "$res/$t.log" >>"$summary"
        done
        ;;
    contract)
        for ((r = 0; r < ROUNDS; r++)); do
            for n in $CONTEXTS; do
                for i in "${!packs[@]}"; do
                    j=$res/contract_${names[$i]}_${n}_r$r.json
                    arm "$i" "$root/${packs[$i]}/bin/orchid" bench --synth 35b-a3b --backend cuda --prompt-len "$n" \
                        --decode-steps 64 --json-out "$j" >"$j.log" 2>&1
                    if [ -f "$j" ]; then
                        note "contract ${names[$i]} ctx $n round $r: $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["results"]; print("prefill %.0f decode %.1f digest %s" % (r["prefill"]["tok_s"], r["decode"]["tok_s"], r["decode"]["token_digest"]))' "$j" 2>&1)"
                    else
                        note "contract ${names[$i]} ctx $n round $r failed: $(tail -1 "$j.log")"
                    fi
                done
            done
        done
        ;;
    stream)
        arm 0 "$root/${packs[0]}/bin/bench_stream" --mb "${STREAM_MB:-256}" >"$res/stream.log" 2>&1
        note "stream (exit $?):"
        grep -E '^\| [a-z]' "$res/stream.log" >>"$summary"
        ;;
    ncu)
        secs=""
        for sct in ${NCU_SECTIONS-SpeedOfLight MemoryWorkloadAnalysis WarpStateStats SchedulerStats}; do secs="$secs --section $sct"; done
        for i in "${!packs[@]}"; do
            l=$res/ncu_${names[$i]}.txt
            rep=()
            [ "${NCU_REPORT:-0}" = 1 ] && rep=(-o "$res/ncu_${names[$i]}")
            arm "$i" timeout "${NCU_TIMEOUT:-240}" ncu --clock-control none --kill yes -k "regex:${NCU_KERNEL:-skinny_pipe}" \
                --launch-skip "${NCU_SKIP:-40}" --launch-count "${NCU_COUNT:-2}" $secs ${NCU_FLAGS:-} "${rep[@]}" \
                "$root/${packs[$i]}/bin/bench_batch_decode" --ctx "${NCU_CTX:-512}" --batches "${NCU_BATCH:-64}" ${NCU_ARGS:-} >"$l" 2>&1
            note "ncu ${names[$i]} (exit $?): $(grep -E 'Duration|DRAM Throughput|Memory Throughput' "$l" | tr -s ' ' | tr '\n' ';' | head -c 600)"
            if [ ${#rep[@]} -gt 0 ] && [ -f "${rep[1]}.ncu-rep" ]; then # the report's pages as text, the report itself dropped (MBs)
                ncu -i "${rep[1]}.ncu-rep" --page details >"$l" 2>&1
                ncu -i "${rep[1]}.ncu-rep" --page raw --csv >"${rep[1]}_raw.csv" 2>&1
                ncu -i "${rep[1]}.ncu-rep" --page source --csv --print-source sass >"${rep[1]}_sass.csv" 2>&1
                rm -f "${rep[1]}.ncu-rep"
            fi
        done
        ;;
    ncuall)
        mets=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum
        mets=$mets,sm__throughput.avg.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.pct_of_peak_sustained_active
        mets=$mets,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size
        for i in "${!packs[@]}"; do
            l=$res/ncuall_${names[$i]}
            arm "$i" timeout "${NCU_TIMEOUT:-240}" ncu --clock-control none --kill yes --launch-skip "${NCUALL_SKIP:-8000}" \
                --launch-count "${NCUALL_COUNT:-200}" --metrics "$mets" --csv --page raw \
                "$root/${packs[$i]}/bin/bench_batch_decode" --ctx "${NCU_CTX:-512}" --batches "${NCU_BATCH:-64}" --pack 8 \
                ${NCU_ARGS:-} >"$l.csv" 2>"$l.err"
            note "ncuall ${names[$i]} (exit $?):"
            python3 tools/ncu_table.py "$l.csv" >"$l.txt" 2>&1
            head -25 "$l.txt" >>"$summary"
        done
        ;;
    batch)
        for ((r = 0; r < ROUNDS; r++)); do
            for i in "${!packs[@]}"; do
                l=$res/batch_${names[$i]}_r$r.log
                arm "$i" timeout "${BATCH_TIMEOUT:-180}" "$root/${packs[$i]}/bin/bench_batch_decode" --ctx 512 --batches "$BATCHES" $BATCH_ARGS >"$l" 2>&1
                note "batch ${names[$i]} round $r: $(grep -c -E '^\| *[0-9]+ \|' "$l") rows$(grep -q -E '^\| *[0-9]+ \|' "$l" || echo ", failed: $(tail -1 "$l")")"
                grep -E '^\| *[0-9]+ \|' "$l" | head -8 >>"$summary"
            done
        done
        if [ "${TRACE:-0}" = 1 ]; then
            for i in "${!packs[@]}"; do
                tb=$root/${packs[$i]}/tr/bench_batch_decode
                [ -x "$tb" ] || continue
                mkdir -p "$res/trace_${names[$i]}"
                arm "$i" "$tb" --ctx 512 --batches "$BATCHES" $BATCH_ARGS --trace "$res/trace_${names[$i]}" >"$res/trace_${names[$i]}.log" 2>&1
                note "trace ${names[$i]}: $(ls "$res/trace_${names[$i]}" | tr '\n' ' ')"
            done
        fi
        ;;
    serve)
        synth_model || continue
        for i in "${!packs[@]}"; do
            j=$res/serve_${names[$i]}.json
            mkdir -p "$res/serve_${names[$i]}"
            arm "$i" python3 bench/serve_load.py --orchid "$root/${packs[$i]}/bin/orchid" --model "$m" \
                --backend "$SERVE_BACKEND" --levels "$LEVELS" --skip "$SERVE_SKIP" --log-dir "$res/serve_${names[$i]}" \
                --json "$j" $SERVE_ARGS >"$j.log" 2>&1
            note "serve ${names[$i]}:"
            grep -E '^\| *[0-9]+ \|' "$j.log" >>"$summary"
        done
        ;;
    echo)
        [ -n "${ORCHID_GPU_TINY:-}" ] || { note "echo: no tiny model"; continue; }
        l=$res/echo_${names[$last]}.log
        arm "$last" timeout 600 python3 bench/echo_check.py --orchid "$root/${packs[$last]}/bin/orchid" \
            --model "$ORCHID_GPU_TINY" --backend cuda --log-dir "$res" ${ECHO_ARGS:---ref-backend cuda --ref-env ORCHID_NO_ROW_SCORES=1 --prefill-chunk 16} >"$l" 2>&1
        note "echo ${names[$last]} (exit $?): $(grep -E '^echo check' "$l" | tail -1)"
        grep -m8 -E '^(MISMATCH|note)' "$l" >>"$summary"
        ;;
    echotime)
        synth_model || continue
        for i in "${!packs[@]}"; do
            j=$res/echotime_${names[$i]}.json
            arm "$i" timeout 600 python3 bench/echo_time.py --orchid "$root/${packs[$i]}/bin/orchid" --model "$m" \
                --backend "$SERVE_BACKEND" --log-dir "$res" --json "$j" ${ECHOTIME_ARGS:-} >"$j.log" 2>&1
            note "echotime ${names[$i]} (exit $?): $(grep -E '^echo time' "$j.log" | tail -1)"
        done
        ;;
    same)
        synth_model || continue
        for i in "${!packs[@]}"; do
            l=$res/same_${names[$i]}.log
            arm "$i" python3 bench/serve_same.py --orchid "$root/${packs[$i]}/bin/orchid" --model "$m" \
                --backend "$SERVE_BACKEND" --log-dir "$res" $SAME_ARGS >"$l" 2>&1
            note "same ${names[$i]} (exit $?): $(grep -E 'completions differ' "$l" | tail -1)"
        done
        ;;
    *) note "unknown phase $phase" ;;
    esac
done
cp "$summary" "$res/"
tar -C "$root" -cf - res | xz -1 -T0 >"$OUT/res.txz"
cat "$summary"
