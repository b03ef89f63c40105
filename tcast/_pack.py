"""Bit packing of codes: little-endian, low bits first (two 4-bit codes a byte, low nibble first;
four 6-bit codes in three bytes), the layout Core AI and OCP MX tooling read."""

from __future__ import annotations

import torch


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack non-negative integer codes (< 2**bits) of any shape into a flat uint8 tensor."""
    if bits == 8:
        return codes.reshape(-1).to(torch.uint8)
    if bits == 16:
        return codes.reshape(-1).to(torch.int32).to(torch.int16).view(torch.uint8)
    if 8 % bits == 0:
        # 1, 2, 4 bits: OR the codes of each byte together in uint8 (no wide temporaries)
        per_byte = 8 // bits
        flat = codes.reshape(-1).to(torch.uint8)
        pad = (-flat.numel()) % per_byte
        if pad:
            flat = torch.cat([flat, flat.new_zeros(pad)])
        lanes = flat.view(-1, per_byte)
        packed = lanes[:, 0].clone()
        for lane in range(1, per_byte):
            packed |= lanes[:, lane] << (lane * bits)
        return packed
    flat = codes.reshape(-1).to(torch.int64)
    # General widths (3, 5, 6, 7, 9..15): through a bit stream.
    positions = torch.arange(bits, device=flat.device, dtype=torch.int64)
    stream = ((flat[:, None] >> positions) & 1).reshape(-1)
    pad = (-stream.numel()) % 8
    if pad:
        stream = torch.cat([stream, stream.new_zeros(pad)])
    weights = torch.arange(8, device=flat.device, dtype=torch.int64)
    return (stream.view(-1, 8) << weights).sum(dim=1).to(torch.uint8)


def unpack_codes(packed: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """Inverse of pack_codes: `count` codes, uint8 for up to 8 bits, else int32."""
    data = packed.reshape(-1)
    if bits == 8:
        return data[:count].clone()
    if bits == 16:
        return data.view(torch.int16)[:count].to(torch.int32) & 0xFFFF
    if 8 % bits == 0:
        # 1, 2, 4 bits: each byte's lanes by shifts, in uint8
        per_byte = 8 // bits
        lanes = [(data >> (lane * bits)) & ((1 << bits) - 1) for lane in range(per_byte)]
        return torch.stack(lanes, dim=1).reshape(-1)[:count]
    wide = data.to(torch.int64)
    positions = torch.arange(8, device=data.device, dtype=torch.int64)
    stream = ((wide[:, None] >> positions) & 1).reshape(-1)[: count * bits]
    weights = torch.arange(bits, device=data.device, dtype=torch.int64)
    codes = (stream.view(count, bits) << weights).sum(dim=1)
    return codes.to(torch.uint8 if bits <= 8 else torch.int32)


def packed_nbytes(count: int, bits: int) -> int:
    return (count * bits + 7) // 8
