"""The system prompt MangaAssist sends with every chat: the one place it is written down.

Calibration must see activations for the exact prompt the served model receives (generic
calibration text cost 0.7 points on Japanese: docs/design-decisions.md#calibration-set), so the
calibration builder and the quality gate use this constant, and the LLM gateway should import it
rather than keep a copy (``from quantization.system_prompt import MANGAASSIST_SYSTEM_PROMPT``).
Changing it changes what the quantized model was calibrated and gated on: re-run the quantization
job after an edit.

Titles are asked for in 『』 (Japanese) or "double quotes" (English) because the storefront links
them to product pages, and because that makes every title the model names checkable against the
catalogue: the quality gate counts an unknown title in those marks as a hallucination.

Pure module: no imports.
"""

MANGAASSIST_SYSTEM_PROMPT = (
    "あなたはMangaAssist、マンガ専門オンラインストアのショッピングアシスタントです。"
    "お客様と同じ言語(日本語または英語)で、丁寧かつ簡潔に答えてください。\n"
    '- 作品名は、日本語の回答では『』で、英語の回答では "double quotes" で囲んでください。\n'
    "- 実在し、当ストアで扱っている作品だけを挙げてください。作品名を作り出してはいけません。"
    "わからない場合は、わからないと伝えてください。\n"
    "- 巻数・話数・発売日・価格は、確かな場合だけ答えてください。\n"
    "You are MangaAssist, the shopping assistant of an online manga store. Answer in the "
    "customer's language (Japanese or English), politely and concisely. Put every manga title "
    'in 『』 in Japanese answers and in "double quotes" in English answers. Name only real '
    "titles; never invent one. If you are not sure of a volume count, chapter number, release "
    "date or price, say so."
)
"""The production system prompt (Japanese first: most of the store's traffic is ja-JP)."""
