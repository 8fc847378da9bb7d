"""Give any body the CRC32 of another by choosing a few letters in it: why PayPal's signature, which covers
the body only by its CRC32, does not bind the body.

CRC32 is affine over GF(2): for inputs of one length, flipping a set of bits changes the CRC by the XOR of
what each flip alone changes, whatever the rest of the input. So each free bit is a known 32-bit column,
and reaching a target CRC is solving 32 linear equations. The free bits are the low four bits of letters
in ``@ABCDEFGHIJKLMNO`` (0x40 to 0x4F), so the forged body stays plain ASCII inside a JSON string.
"""

from __future__ import annotations

import zlib

FILLER = b"@" * 12
"""Twelve letters: 48 free bits, comfortably more than the 32 a CRC has."""


def forge(body: bytes, target_crc: int, *, filler: bytes = FILLER) -> bytes:
    """``body`` with ``filler`` (which must occur once, inside a JSON string) rewritten so that the result's
    CRC32 is ``target_crc``. Raises ValueError if the chosen bits cannot reach it (they always can here)."""
    position = body.index(filler)
    if (
        body.count(filler) != 1
        or any(byte & 0x0F for byte in filler)
        or any(b & 0xF0 != 0x40 for b in filler)
    ):
        raise ValueError("filler must occur once and be made of '@' (0x40)")
    base = zlib.crc32(body)
    columns: list[tuple[int, int]] = []  # (effect on the CRC, which bit of the filler)
    for offset in range(len(filler)):
        for bit in range(4):
            flipped = bytearray(body)
            flipped[position + offset] ^= 1 << bit
            columns.append((zlib.crc32(bytes(flipped)) ^ base, offset * 4 + bit))
    chosen = _solve(columns, base ^ target_crc)
    forged = bytearray(body)
    for index in chosen:
        forged[position + index // 4] ^= 1 << (index % 4)
    result = bytes(forged)
    assert zlib.crc32(result) == target_crc
    return result


def _solve(columns: list[tuple[int, int]], target: int) -> list[int]:
    # Gaussian elimination over GF(2): each row is (32-bit effect, set of free bits producing it).
    basis: dict[int, tuple[int, int]] = {}  # leading bit -> (effect, mask of free bits)
    for effect, index in columns:
        mask = 1 << index
        for lead in sorted(basis, reverse=True):
            if effect >> lead & 1:
                effect ^= basis[lead][0]
                mask ^= basis[lead][1]
        if effect:
            basis[effect.bit_length() - 1] = (effect, mask)
    mask = 0
    remaining = target
    for lead in sorted(basis, reverse=True):
        if remaining >> lead & 1:
            remaining ^= basis[lead][0]
            mask ^= basis[lead][1]
    if remaining:
        raise ValueError("the free bits cannot reach this CRC")
    return [index for index in range(mask.bit_length()) if mask >> index & 1]
