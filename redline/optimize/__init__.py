"""Quantization behind an accuracy gate: build a ladder of variants of one model, measure
each for quality against the reference and for speed, keep the fastest that passes.

    evalset  → the held-out text and question set every variant is measured on
    runner   → what a measured model must offer (score, answer, speed)
    gguf, hf → variants and runners for llama.cpp files and transformers models
    quality, speed → the measurements; gate → the verdict; ladder → the whole run; report
"""
