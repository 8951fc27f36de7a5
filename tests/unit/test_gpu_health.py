"""Parsing nvidia-smi output (and dmesg Xid lines) from a preflight health command.

The samples follow the real layouts: `nvidia-smi -q` on Ampere/Hopper drivers
(SRAM/DRAM counters, with or without the Parity/SEC-DED split), on Volta-era drivers
(Single/Double Bit sections with a Total), and `--query-gpu ... --format=csv`.
"""

from __future__ import annotations

import pytest

from activities.nodes.agent import GpuHealth
from activities.nodes.gpu_health import gpu_problems, parse_gpu_health, parse_nvidia_smi

A100_TWO_GPUS = """
==============NVSMI LOG==============

Timestamp                                 : Wed Jun  7 19:32:16 2023
Driver Version                            : 510.73.08
CUDA Version                              : 11.6

Attached GPUs                             : 2
GPU 00000000:10:1C.0
    Product Name                          : NVIDIA A100-SXM4-80GB
    Persistence Mode                      : Enabled
    Ecc Mode
        Current                           : Enabled
        Pending                           : Enabled
    ECC Errors
        Volatile
            SRAM Correctable              : 0
            SRAM Uncorrectable            : 0
            DRAM Correctable              : 177
            DRAM Uncorrectable            : 0
        Aggregate
            SRAM Correctable              : 0
            SRAM Uncorrectable            : 4
            DRAM Correctable              : 177
            DRAM Uncorrectable            : 11
    Retired Pages
        Single Bit ECC                    : N/A
        Double Bit ECC                    : N/A
        Pending Page Blacklist            : N/A
    Remapped Rows
        Correctable Error                 : 1
        Uncorrectable Error               : 0
        Pending                           : Yes
        Remapping Failure Occurred        : No
GPU 00000000:10:1D.0
    Product Name                          : NVIDIA A100-SXM4-80GB
    ECC Errors
        Volatile
            SRAM Correctable              : 0
            SRAM Uncorrectable            : 1
            DRAM Correctable              : 0
            DRAM Uncorrectable            : 2
        Aggregate
            SRAM Correctable              : 0
            SRAM Uncorrectable            : 1
            DRAM Correctable              : 0
            DRAM Uncorrectable            : 2
    Processes                             : None
"""

H100_SPLIT_SRAM = """
==============NVSMI LOG==============

Attached GPUs                             : 1
GPU 00000000:18:00.0
    Product Name                          : NVIDIA H100 80GB HBM3
    ECC Errors
        Volatile
            SRAM Correctable              : 0
            SRAM Uncorrectable Parity     : 1
            SRAM Uncorrectable SEC-DED    : 2
            DRAM Correctable              : 0
            DRAM Uncorrectable            : 0
        Aggregate
            SRAM Correctable              : 0
            SRAM Uncorrectable Parity     : 9
            SRAM Uncorrectable SEC-DED    : 9
            DRAM Correctable              : 0
            DRAM Uncorrectable            : 9
            SRAM Threshold Exceeded       : No
        Aggregate Uncorrectable SRAM Sources
            SRAM L2                       : 0
            SRAM SM                       : 0
"""

V100_BIT_SECTIONS = """
==============NVSMI LOG==============

Attached GPUs                             : 1
GPU 00000000:00:1E.0
    Product Name                          : Tesla V100-SXM2-16GB
    ECC Errors
        Volatile
            Single Bit
                Device Memory             : 5
                Register File             : 0
                L1 Cache                  : 0
                L2 Cache                  : 0
                Texture Memory            : N/A
                Texture Shared            : N/A
                CBU                       : N/A
                Total                     : 5
            Double Bit
                Device Memory             : 1
                Register File             : 0
                L1 Cache                  : 0
                L2 Cache                  : 0
                Texture Memory            : N/A
                Texture Shared            : N/A
                CBU                       : 0
                Total                     : 1
        Aggregate
            Single Bit
                Device Memory             : 50
                Total                     : 50
            Double Bit
                Device Memory             : 3
                Total                     : 3
    Retired Pages
        Single Bit ECC                    : 0
        Double Bit ECC                    : 0
"""

CONSUMER_NO_ECC = """
==============NVSMI LOG==============

Attached GPUs                             : 1
GPU 00000000:01:00.0
    Product Name                          : NVIDIA GeForce RTX 3090
    Ecc Mode
        Current                           : N/A
        Pending                           : N/A
    ECC Errors
        Volatile
            SRAM Correctable              : N/A
            SRAM Uncorrectable            : N/A
            DRAM Correctable              : N/A
            DRAM Uncorrectable            : N/A
"""

CSV_WITH_HEADER = """\
index, pci.bus_id, name, memory.total [MiB], ecc.errors.uncorrected.volatile.total
0, 00000000:07:00.0, NVIDIA A100-SXM4-80GB, 81920 MiB, 0
1, 00000000:0B:00.0, NVIDIA A100-SXM4-80GB, 81920 MiB, 3
2, 00000000:48:00.0, NVIDIA A100-SXM4-80GB, 81920 MiB, [N/A]
3, 00000000:4C:00.0, NVIDIA A100-SXM4-80GB, 81920 MiB, 0
"""

CSV_PER_LOCATION = """\
index, ecc.errors.uncorrected.volatile.device_memory, ecc.errors.uncorrected.volatile.sram
0, 2, 1
1, 0, 0
"""

DMESG_XID = (
    "[ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 79, pid=1896, GPU has fallen off the bus.\n"
    "[ 1240.000001] NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked "
    "for remapping, reset gpu to activate.\n"
    "[ 1250.000000] eth0: link up\n"
)


def test_a100_counts_only_volatile_uncorrectable_per_gpu() -> None:
    health = parse_gpu_health(A100_TWO_GPUS)
    assert health is not None
    assert (health.count, health.ecc_errors, health.xid_errors) == (2, 3, 0)
    assert health.details == [
        "GPU 00000000:10:1D.0: 3 uncorrectable ECC error(s) since the driver loaded"
    ]


def test_h100_split_sram_counters_are_summed() -> None:
    health = parse_gpu_health(H100_SPLIT_SRAM)
    assert health is not None
    assert (health.count, health.ecc_errors) == (1, 3)


@pytest.mark.parametrize("trailing", ["", "            "])
def test_volta_double_bit_total_only(trailing: str) -> None:
    # Real output pads these section names with trailing spaces.
    health = parse_gpu_health(V100_BIT_SECTIONS.replace(" Bit\n", f" Bit{trailing}\n"))
    assert health is not None
    assert (health.count, health.ecc_errors) == (1, 1)


def test_not_available_counters_are_zero() -> None:
    assert parse_gpu_health(CONSUMER_NO_ECC) == GpuHealth(count=1)


def test_attached_gpus_line_counts_when_blocks_are_cut() -> None:
    health = parse_gpu_health("Attached GPUs                             : 8\n")
    assert health is not None and health.count == 8


def test_csv_with_header() -> None:
    health = parse_gpu_health(CSV_WITH_HEADER)
    assert health is not None
    assert (health.count, health.ecc_errors) == (4, 3)
    assert health.details == [
        "GPU 00000000:0B:00.0: 3 uncorrectable ECC error(s) since the driver loaded"
    ]


def test_csv_per_location_columns_are_summed() -> None:
    health = parse_gpu_health(CSV_PER_LOCATION)
    assert health is not None
    assert (health.count, health.ecc_errors) == (2, 3)


def test_csv_without_header_is_not_trusted() -> None:
    assert parse_gpu_health("0, NVIDIA A100, 0\n1, NVIDIA A100, 5\n") is None


def test_xid_lines_from_dmesg() -> None:
    health = parse_gpu_health(DMESG_XID)
    assert health is not None
    assert (health.count, health.xid_errors) == (0, 2)
    assert health.details[0] == ("Xid 79 (PCI:0000:3b:00): pid=1896, GPU has fallen off the bus.")


def test_query_plus_xid_in_one_output() -> None:
    health = parse_gpu_health(A100_TWO_GPUS + DMESG_XID)
    assert health is not None
    assert (health.count, health.ecc_errors, health.xid_errors) == (2, 3, 2)


@pytest.mark.parametrize(
    "text",
    ["", "all good\n", "No devices were found\n", "key : value\n", "a, b\n1, 2\n"],
)
def test_unrelated_output_is_not_gpu_health(text: str) -> None:
    assert parse_gpu_health(text) is None


def test_details_are_bounded() -> None:
    many = "".join(f"NVRM: Xid (PCI:0000:{i:02x}:00): 13, Graphics Exception\n" for i in range(50))
    health = parse_gpu_health(many)
    assert health is not None and health.xid_errors == 50 and len(health.details) == 20


def test_problems_name_the_node() -> None:
    assert gpu_problems(GpuHealth(count=8), "n1") == []
    problems = gpu_problems(GpuHealth(count=8, ecc_errors=2, xid_errors=1), "n1")
    assert len(problems) == 2 and all("node n1" in p for p in problems)


def test_local_checks_alias() -> None:
    assert parse_nvidia_smi(H100_SPLIT_SRAM) == parse_gpu_health(H100_SPLIT_SRAM)
