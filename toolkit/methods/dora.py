"""DoRA through PEFT (Liu et al. 2024): LoRA on the direction of each weight, with its magnitude
trained apart (`LoraConfig(use_dora=True)`); every LoRA setting applies, merging included."""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.methods import METHODS
from toolkit.methods.lora import Lora


@METHODS.register("dora")
@dataclass
class Dora(Lora):
    use_dora = True
    transformers_loads = False  # transformers 5.24 drops the trained magnitudes (other outputs, no error)
    compile_eager = "PEFT's DoRA layer makes a call dynamo cannot trace (a graph break in every layer)"
