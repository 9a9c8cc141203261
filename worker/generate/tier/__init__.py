"""The tier stage: exact or fp8, compiled sizes, step caches; held around one denoise."""
