"""tools/ncu_table.py, the per-kernel table of gpu_run's `ncuall` phase: grouping by kernel
(argument list dropped) and grid, medians, totals in order, thousands separators, the
program's own lines mixed into ncu's stdout, and a file that is not ncu's raw CSV."""

import subprocess
import sys

from serverproc import REPO

TOOL = REPO / "tools" / "ncu_table.py"

CSV = """==PROF== Connected to process 1
bench_batch_decode: prefilled 64 sessions
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Device","CC","gpu__time_duration.sum","dram__throughput.avg.pct_of_peak_sustained_elapsed","dram__bytes_read.sum","sm__throughput.avg.pct_of_peak_sustained_elapsed","smsp__issue_active.avg.pct_of_peak_sustained_active","sm__warps_active.avg.pct_of_peak_sustained_active","launch__grid_size"
"","","","","","","","","","usecond","%","byte","%","%","%",""
"0","1","b","h","skinny_pipe_kernel<1>(sp_args)","1","7","0","9.0","115.0","75.0","270,000,000","40.0","35.0","12.0","132"
"1","1","b","h","skinny_pipe_kernel<1>(sp_args)","1","7","0","9.0","113.0","77.0","270,200,000","42.0","37.0","12.0","132"
"2","1","b","h","skinny_pipe_kernel<1>(sp_args)","1","7","0","9.0","200.0","76.0","270,100,000","41.0","36.0","12.0","132"
"3","1","b","h","rmsnorm_kernel(float const*, int)","1","7","0","9.0","9.0","3.0","524,288","5.0","10.0","30.0","64"
"4","1","b","h","rmsnorm_kernel(float const*, int)","1","7","0","9.0","9.4","3.0","524,288","5.0","10.0","30.0","1"
==PROF== Disconnected from process 1
"""


def run(*args):
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True)


def test_table(tmp_path):
    f = tmp_path / "ncuall.csv"
    f.write_text(CSV)
    r = run(str(f))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("5 launches, 3 kernels, total 446 usecond")
    rows = [l.split() for l in lines[2:]]
    # sorted by total: the three skinny_pipe launches first, their median and medians of the rest
    assert rows[0][:5] == ["skinny_pipe_kernel<1>", "132", "3", "428", "115.0"]
    assert rows[0][5:] == ["76.0", "270100000", "41.0", "36.0", "12.0"]
    # the same kernel at another grid size is its own line
    assert [r[:3] for r in rows[1:]] == [["rmsnorm_kernel", "1", "1"], ["rmsnorm_kernel", "64", "1"]]
    assert len(run(str(f), "--top", "1").stdout.splitlines()) == 3


def test_not_ncu_csv(tmp_path):
    f = tmp_path / "x.csv"
    f.write_text("a,b\n1,2\n")
    r = run(str(f))
    assert r.returncode != 0 and "no 'Kernel Name' column" in r.stderr
    assert run(str(f), "--top").returncode != 0
