"""The model stage: resident pipelines under a memory budget, the fast load path, the warm-up."""
