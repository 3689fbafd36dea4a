"""Measurements of the P² paper's Appendix A (and Table 4), transcribed for benchmarks.

How this was read: the extracted text of Appendix A is one long run of tokens. Each
configuration reads ``axes [reduce] synthesis-time sim-ring sim-tree out/total-ring
out/total-tree`` and then, per parallelism matrix, ``[[row] [row] ..] allreduce-ring
allreduce-tree optimal-ring optimal-tree speedup-ring speedup-tree`` (seconds). The V100 4-node
three-axis rows carry one time per column (NCCL ring only). The text is cut after the third
A100 4-node three-axis configuration, so ``[4 2 8]`` lacks one of its five matrices; Table 4's
``[2 2 16]`` (ring only, two matrices) is added from the main text, with its printed total
235 (only 4 matrices exist for these axes, so at most 4 x 47 = 188 programs: a misprint).
Typos are kept as printed except one: V100 4-node ``[8 4]`` reduce 0, matrix
``[[4 2] [1 4]]`` prints the optimal ring time as ``1.84`` with speedup ``1`` over ``14.84``;
it is read as 14.84. The V100 4-node ``[32]`` row disagrees with Table 4 (L1: optimal 3.45,
1.4x); the appendix values are kept.

Below, a configuration line is followed by one line per matrix: the matrix (rows = axes,
columns = levels), then AllReduce ring, tree, optimal program ring, tree ("-": not given).
"""

from __future__ import annotations

from dataclasses import dataclass

Matrix = tuple[tuple[int, ...], ...]

_TABLE = """
gcp-a100-16x2 axes=32 reduce=0 programs=47 synthesis=0.244
    [[2 16]]                   4.74   3.57   3.18   2.83
gcp-a100-16x2 axes=2,16 reduce=0 programs=6 synthesis=0.004
    [[1 2] [2 8]]              0.12   0.17   0.12   0.15
    [[2 1] [1 16]]            36.69  37.18  36.69  37.18
gcp-a100-16x2 axes=2,16 reduce=1 programs=50 synthesis=0.065
    [[2 1] [1 16]]             0.18   0.22   0.18    0.2
    [[1 2] [2 8]]              8.44   4.82   4.77   4.82
gcp-a100-16x2 axes=4,8 reduce=0 programs=50 synthesis=0.026
    [[1 4] [2 4]]              0.15    0.2   0.15   0.17
    [[2 2] [1 8]]             28.91  19.61  18.48   18.5
gcp-a100-16x2 axes=4,8 reduce=1 programs=50 synthesis=0.03
    [[2 2] [1 8]]              0.17   0.21   0.17   0.18
    [[1 4] [2 4]]             16.04   9.15   8.97   9.01
gcp-a100-16x2 axes=8,4 reduce=0 programs=50 synthesis=0.033
    [[1 8] [2 2]]              0.17   0.21   0.17   0.19
    [[2 4] [1 4]]             16.84   9.26   9.19    9.1
gcp-a100-16x2 axes=8,4 reduce=1 programs=50 synthesis=0.026
    [[2 4] [1 4]]              0.15    0.2   0.15   0.17
    [[1 8] [2 2]]             28.78  18.93  18.48     18
gcp-a100-16x2 axes=16,2 reduce=0 programs=50 synthesis=0.067
    [[1 16] [2 1]]             0.18   0.22   0.18   0.19
    [[2 8] [1 2]]              8.86   5.34   5.05   5.21
gcp-a100-16x2 axes=16,2 reduce=1 programs=6 synthesis=0.005
    [[2 8] [1 2]]              0.11   0.17   0.11   0.14
    [[1 16] [2 1]]            36.84  36.82  36.84  36.82
gcp-a100-16x4 axes=64 reduce=0 programs=47 synthesis=1.161
    [[4 16]]                   5.18   5.75   4.29   4.74
gcp-a100-16x4 axes=2,32 reduce=0 programs=6 synthesis=0.006
    [[1 2] [4 8]]              0.12   0.17   0.12   0.15
    [[2 1] [2 16]]            37.16  36.94  37.04  36.94
gcp-a100-16x4 axes=2,32 reduce=1 programs=94 synthesis=0.463
    [[2 1] [2 16]]             4.81   3.41   3.05   3.07
    [[1 2] [4 8]]              8.74   9.89   6.91      8
gcp-a100-16x4 axes=4,16 reduce=0 programs=53 synthesis=0.043
    [[1 4] [4 4]]              0.15    0.2   0.15   0.17
    [[2 2] [2 8]]             28.77  19.81  18.24  18.55
    [[4 1] [1 16]]            56.13   89.7  55.99  56.13
gcp-a100-16x4 axes=4,16 reduce=1 programs=97 synthesis=0.133
    [[4 1] [1 16]]             0.18   0.22   0.18   0.19
    [[2 2] [2 8]]              8.39   4.99   4.81   4.82
    [[1 4] [4 4]]              17.7  19.03  13.38  14.85
gcp-a100-16x4 axes=8,8 reduce=0 programs=97 synthesis=0.091
    [[1 8] [4 2]]              0.17   0.21   0.17   0.18
    [[2 4] [2 4]]             16.52   9.18   9.21   9.18
    [[4 2] [1 8]]             34.05  41.23  28.86  29.79
gcp-a100-16x4 axes=8,8 reduce=1 programs=97 synthesis=0.084
    [[4 2] [1 8]]              0.17   0.21   0.17   0.18
    [[2 4] [2 4]]             15.68   9.43   8.92   9.22
    [[1 8] [4 2]]             33.92  41.06  27.93  29.36
gcp-a100-16x4 axes=16,4 reduce=0 programs=97 synthesis=0.149
    [[1 16] [4 1]]             0.18   0.22   0.18    0.2
    [[2 8] [2 2]]              8.81   5.42   5.01   5.25
    [[4 4] [1 4]]              18.3  20.13  14.13   14.9
gcp-a100-16x4 axes=16,4 reduce=1 programs=53 synthesis=0.042
    [[4 4] [1 4]]              0.15    0.2   0.15   0.18
    [[2 8] [2 2]]             28.68  18.47  19.09  18.41
    [[1 16] [4 1]]            57.13  85.22  56.23  55.63
gcp-a100-16x4 axes=32,2 reduce=0 programs=94 synthesis=0.483
    [[2 16] [2 1]]             4.74   3.99   3.14   3.13
    [[4 8] [1 2]]              9.37  10.41   7.23   7.71
gcp-a100-16x4 axes=32,2 reduce=1 programs=6 synthesis=0.008
    [[4 8] [1 2]]              0.11   0.17   0.11   0.15
    [[2 16] [2 1]]            37.18   37.1  37.18   37.1
gcp-a100-16x4 axes=16,2,2 reduce=0,2 programs=188 synthesis=0.968
    [[1 16] [2 1] [2 1]]       4.79   3.69   4.63   2.71
    [[2 8] [2 1] [1 2]]        4.91   3.97    3.1   2.93
    [[2 8] [1 2] [2 1]]        9.05  10.29   9.03   9.46
    [[4 4] [1 2] [1 2]]        9.14  10.32   7.08   7.87
gcp-a100-16x4 axes=8,2,4 reduce=0,2 programs=235 synthesis=1.107
    [[1 8] [2 1] [2 2]]         4.8   3.62   4.64   2.67
    [[2 4] [2 1] [1 4]]        4.82   3.87   3.12   3.08
    [[2 4] [1 2] [2 2]]        8.91   9.68   8.91   9.29
    [[4 2] [1 2] [1 4]]        9.19  10.24   7.02   7.69
    [[1 8] [1 2] [4 1]]        9.21  10.37    5.5   8.72
gcp-a100-16x4 axes=4,2,8 reduce=0,2 programs=235 synthesis=1.143 incomplete
    [[2 2] [2 1] [1 8]]        4.74   3.54   3.04   2.99
    [[1 4] [2 1] [2 4]]        4.77   3.77   4.48   3.54
    [[4 1] [1 2] [1 8]]        8.73   9.81      7   8.12
    [[1 4] [1 2] [4 2]]        9.12   9.98   8.65    8.8
# Table 4 (I1, I2), not in the appendix text: ring only, two of its matrices.
gcp-a100-16x4 axes=2,2,16 reduce=0,2 programs=235 synthesis=0.93 incomplete
    [[2 1] [2 1] [1 16]]       4.82      -   2.99      -
    [[1 2] [2 1] [2 8]]        5.28      -   4.77      -
gcp-v100-8x2 axes=16 reduce=0 programs=47 synthesis=0.058
    [[2 8]]                    4.58    2.3   2.41    2.3
gcp-v100-8x2 axes=2,8 reduce=0 programs=6 synthesis=0.0035
    [[1 2] [2 4]]              9.37   8.44   9.37   8.44
    [[2 1] [1 8]]             14.53  14.55  14.53  14.55
gcp-v100-8x2 axes=2,8 reduce=1 programs=50 synthesis=0.0257
    [[2 1] [1 8]]              0.28    0.4   0.28    0.3
    [[1 2] [2 4]]              6.59    3.7      6    3.7
gcp-v100-8x2 axes=4,4 reduce=0 programs=50 synthesis=0.0181
    [[1 4] [2 2]]             12.55  13.01  12.55  13.01
    [[2 2] [1 4]]             13.11  16.11  13.11   13.5
gcp-v100-8x2 axes=4,4 reduce=1 programs=50 synthesis=0.0182
    [[2 2] [1 4]]              2.96   0.43   2.29   0.43
    [[1 4] [2 2]]             10.95   7.42   7.52   7.26
gcp-v100-8x2 axes=8,2 reduce=0 programs=50 synthesis=0.0272
    [[1 8] [2 1]]              0.28    0.4   0.28    0.3
    [[2 4] [1 2]]             14.24  15.47   14.2  14.48
gcp-v100-8x2 axes=8,2 reduce=1 programs=6 synthesis=0.0036
    [[2 4] [1 2]]              0.32   0.33   0.32   0.33
    [[1 8] [2 1]]             14.51  14.81  14.51  14.47
gcp-v100-8x4 axes=32 reduce=0 programs=47 synthesis=0.209
    [[4 8]]                    4.83   4.57   4.83   3.66
gcp-v100-8x4 axes=2,16 reduce=0 programs=6 synthesis=0.0043
    [[1 2] [4 4]]              9.17   8.42   9.17   8.42
    [[2 1] [2 8]]             14.47  14.52  14.47  14.51
gcp-v100-8x4 axes=2,16 reduce=1 programs=94 synthesis=0.121
    [[2 1] [2 8]]              4.37   2.26   2.42   2.25
    [[1 2] [4 4]]              7.18    8.1   7.16    7.1
gcp-v100-8x4 axes=4,8 reduce=0 programs=53 synthesis=0.027
    [[1 4] [4 2]]              12.6     13   12.6     13
    [[2 2] [2 4]]             13.69  16.07  13.69  13.56
    [[4 1] [1 8]]             22.21  30.55  22.04  21.49
gcp-v100-8x4 axes=4,8 reduce=1 programs=97 synthesis=0.096
    [[4 1] [1 8]]              0.28    0.4   0.28    0.3
    [[2 2] [2 4]]               6.6   3.82   5.78   3.74
    [[1 4] [4 2]]             12.94  15.47  11.21  12.12
gcp-v100-8x4 axes=8,4 reduce=0 programs=97 synthesis=0.103
    [[1 8] [4 1]]              0.28   0.39   0.28    0.3
    [[2 4] [2 2]]             14.25  15.48  14.23  14.49
    [[4 2] [1 4]]             14.84   19.9  14.84  15.33
gcp-v100-8x4 axes=8,4 reduce=1 programs=53 synthesis=0.0435
    [[4 2] [1 4]]              2.96   0.43   2.29   0.43
    [[2 4] [2 2]]             10.98   7.34   7.58   7.34
    [[1 8] [4 1]]             21.74  30.42  21.74  21.71
gcp-v100-8x4 axes=16,2 reduce=0 programs=94 synthesis=0.168
    [[2 8] [2 1]]              4.47   2.25   2.44   2.25
    [[4 4] [1 2]]                15  17.58  14.99  15.01
gcp-v100-8x4 axes=16,2 reduce=1 programs=6 synthesis=0.004
    [[4 4] [1 2]]              0.32   0.33   0.32   0.33
    [[2 8] [2 1]]             14.53  14.89  14.53  14.66
# The V100 4-node three-axis rows carry NCCL ring times only.
gcp-v100-8x4 axes=2,2,8 reduce=0,2 programs=188 synthesis=0.229
    [[1 2] [2 1] [2 4]]        4.29      -   4.29      -
    [[2 1] [2 1] [1 8]]        4.57      -    2.4      -
    [[2 1] [1 2] [2 4]]        7.17      -   6.95      -
    [[1 2] [1 2] [4 2]]        9.41      -   9.41      -
gcp-v100-8x4 axes=8,2,2 reduce=0,2 programs=188 synthesis=0.243
    [[1 8] [2 1] [2 1]]         4.4      -    4.4      -
    [[2 4] [2 1] [1 2]]         4.8      -   2.35      -
    [[4 2] [1 2] [1 2]]        9.36      -   9.35      -
    [[2 4] [1 2] [2 1]]       15.02      -  14.95      -
"""


@dataclass(frozen=True)
class MatrixMeasurement:
    matrix: Matrix
    allreduce_ring: float
    allreduce_tree: float | None
    optimal_ring: float
    optimal_tree: float | None


@dataclass(frozen=True)
class ConfigMeasurement:
    system: str
    axes: tuple[int, ...]
    reduce: tuple[int, ...]
    total_programs: int
    synthesis_time: float
    matrices: tuple[MatrixMeasurement, ...]
    complete: bool = True  # False where the text lost some of the matrices


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(","))


def _matrix_line(line: str) -> MatrixMeasurement:
    head, _, numbers = line.strip().partition("]]")
    rows = tuple(tuple(int(x) for x in row.split()) for row in head.strip("[ ").split("] ["))
    values = [None if v == "-" else float(v) for v in numbers.split()]
    return MatrixMeasurement(rows, *values)


def _parse(text: str) -> tuple[ConfigMeasurement, ...]:
    configs: list[ConfigMeasurement] = []
    header: dict[str, str] = {}
    matrices: list[MatrixMeasurement] = []

    def flush() -> None:
        if header:
            configs.append(
                ConfigMeasurement(
                    header["system"],
                    _ints(header["axes"]),
                    _ints(header["reduce"]),
                    int(header["programs"]),
                    float(header["synthesis"]),
                    tuple(matrices),
                    "incomplete" not in header,
                )
            )

    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.startswith(" "):
            matrices.append(_matrix_line(line))
            continue
        flush()
        system, *fields = line.split()
        header = {"system": system}
        header.update(f.partition("=")[::2] for f in fields)
        matrices = []
    flush()
    return tuple(configs)


APPENDIX_A: tuple[ConfigMeasurement, ...] = _parse(_TABLE)
