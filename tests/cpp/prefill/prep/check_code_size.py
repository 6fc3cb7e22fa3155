"""Fails when a kernel's SASS in a cubin exceeds an instruction budget.

Usage: check_code_size.py <cubin> <kernel-name-substring> <max-instructions>

Reads the ELF section headers of the cubin (no CUDA tools needed) and counts the bytes of every
.text.<mangled name> section whose name contains the substring; an sm_90 instruction is 16 bytes.
The prep kernel's budget comes from session 13 (docs/design/20261129-prefill.md): at two CTAs per
SM it ran 22% slower at 8,720 instructions than at 8,000, with the extra code never executed.
"""

import struct
import sys


def text_sections(path):
    data = open(path, "rb").read()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise SystemExit(f"{path}: not a 64-bit ELF file")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab_off = headers[shstrndx][4]

    def name(h):
        start = strtab_off + h[0]
        return data[start:data.index(b"\0", start)].decode()

    return {name(h): h[5] for h in headers if name(h).startswith(".text.")}


def main(argv):
    if len(argv) != 4:
        raise SystemExit(__doc__)
    path, needle, budget = argv[1], argv[2], int(argv[3])
    found = {n: size for n, size in text_sections(path).items() if needle in n}
    if not found:
        raise SystemExit(f"{path}: no .text section contains {needle!r}")
    worst = 0
    for n, size in sorted(found.items()):
        count = size // 16
        worst = max(worst, count)
        print(f"{n[6:]}: {count} instructions (budget {budget})")
    if worst > budget:
        raise SystemExit(f"FAIL: {worst} instructions exceed the budget of {budget}")
    print("OK")


if __name__ == "__main__":
    main(sys.argv)
