"""Scene layout: how key bits become 3D coordinates (see csrc/core/scene.h for the geometry)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SceneConfig:
    """Split of the 64 key bits over the axes (x takes the lowest bits) and per-axis scale factors.

    RX uses the paper's 3D mode, 23/23/18 bits, unscaled. cgRX scales y by 2^15 and z by 2^25 (the "scaled
    mapping"), which steers the BVH builder to group representatives along x. Every axis holds at most 23
    bits so that all coordinates, triangle corners and ray ends are exact in float32.
    """

    bits_x: int = 23
    bits_y: int = 23
    bits_z: int = 18
    scale_y_log2: int = 0
    scale_z_log2: int = 0

    def __post_init__(self) -> None:
        bits = (self.bits_x, self.bits_y, self.bits_z)
        if not all(isinstance(b, int) for b in bits) or sum(bits) != 64:
            raise ValueError(f"the axis bit counts must be integers adding up to 64, got {bits}")
        if not (1 <= self.bits_x <= 23 and 0 <= self.bits_y <= 23 and 0 <= self.bits_z <= 23):
            raise ValueError(
                f"each axis takes at most 23 key bits (x at least 1) so coordinates stay exact in float32, got {bits}"
            )
        for s in (self.scale_y_log2, self.scale_z_log2):
            if not isinstance(s, int) or not 0 <= s <= 60:
                raise ValueError(f"axis scales are powers of two given by their exponent 0..60, got {s}")

    def as_list(self) -> list[int]:
        return [self.bits_x, self.bits_y, self.bits_z, self.scale_y_log2, self.scale_z_log2]


RX_DEFAULT = SceneConfig()
