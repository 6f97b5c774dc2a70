"""The text the platform shares: the production system prompt and a manga-shop sample corpus.

* :data:`MANGAASSIST_SYSTEM_PROMPT` — the system prompt MangaAssist sends with every chat, written
  down once. The quantization job calibrates and gates the AWQ model on it (generic calibration
  text cost 0.7 points on Japanese: docs/design-decisions.md#calibration-set) and the gateway warms
  up with it (its KV blocks then sit in the prefix cache). Changing it changes what the quantized
  model was calibrated and gated on: re-run the quantization job after an edit. Titles are asked
  for in 『』 (Japanese) or "double quotes" (English) because the storefront links them to product
  pages and because that makes every title the model names checkable against the catalogue: the
  quality gate counts an unknown title in those marks as a hallucination.
* :data:`MANGA_CORPUS_EN` / :data:`MANGA_CORPUS_JA` and the short :data:`SYSTEM_PROMPT_EN` /
  :data:`SYSTEM_PROMPT_JA` — sample customer and assistant lines in both languages: the gateway's
  warmup conversations, the demo tokenizer that tests, benchmarks and ``make local`` train, and
  the conversations the tests and benchmarks send.
* :data:`LLAMA3_INSTRUCT_CHAT_TEMPLATE` and :data:`LLAMA3_SPECIAL_TOKENS` — the chat format of the
  model family the platform serves, verbatim from Meta-Llama-3-8B-Instruct's
  ``tokenizer_config.json``: the demo tokenizer and the real-engine tier's tiny Llama carry them,
  so the gateway's rendering is checked against the real template everywhere.

Shipped in the LLM image and the quantization image; pure module (no imports).
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

MANGA_CORPUS_EN: tuple[str, ...] = (
    "Is One Piece volume 1 available in English?",
    "What manga series are similar to Naruto?",
    "Recommend five manga for someone who likes dark fantasy.",
    "Attack on Titan is complete in 34 volumes; the colossal edition collects them in 7.",
    "The deluxe edition of One Piece has color pages, a hardcover and a larger format.",
    "Demon Slayer follows Tanjiro Kamado, who joins the Demon Slayer Corps to save his sister.",
    "Jujutsu Kaisen volume 24 ships next Friday from the Tokyo warehouse.",
    "Frieren: Beyond Journey's End is a quiet fantasy about memory and time.",
    "Spy x Family mixes comedy, action and a found-family story.",
    "Chainsaw Man part two started serialization in Shonen Jump+.",
    "My Hero Academia ended with volume 42 in Japan.",
    "Where is my order? I bought the Berserk deluxe set last week.",
    "I would like to return a damaged copy of Vagabond volume 3.",
    "Can I exchange the box set for the single volumes instead?",
    "Your order shipped on Monday and should arrive within three business days.",
    "Refunds go back to the original payment method within five to seven days.",
    "Please escalate this: the tracking number has not updated for ten days.",
    "Do you have the first printing of Dragon Ball volume 1?",
    "Which edition of Monster is the best value for a new reader?",
    "I prefer seinen manga with slow pacing and detailed artwork.",
    "I do not like romance; please skip romantic comedies in recommendations.",
    "The anime adaptation covers the manga up to chapter 137.",
    "Shonen Jump releases new chapters every Monday at midnight Japan time.",
    "Light novels are sold in a separate section from manga volumes.",
    "The Kindle edition includes the bonus chapter from the print release.",
    "Blue Lock volume 28 is on preorder with a limited acrylic stand.",
    "How many chapters of Kingdom have been translated so far?",
    "Is Oshi no Ko appropriate for a fifteen year old reader?",
    "Please recommend a sports manga similar to Haikyu!!",
    "Thanks, that helps a lot. Can you also check the price of volume 2?",
)

MANGA_CORPUS_JA: tuple[str, ...] = (
    "ワンピースの1巻は英語版がありますか？",
    "ナルトに似たマンガを教えてください。",
    "鬼滅の刃に似たマンガを5つ教えてください。",
    "進撃の巨人は全34巻で完結しています。",
    "呪術廻戦の最新刊はいつ発売されますか？",
    "葬送のフリーレンは旅の終わりから始まるファンタジーです。",
    "SPY×FAMILYはコメディとアクションが楽しめる作品です。",
    "チェンソーマン第二部は少年ジャンプ+で連載中です。",
    "僕のヒーローアカデミアは42巻で完結しました。",
    "注文した商品がまだ届いていません。配送状況を確認できますか？",
    "ベルセルクの完全版セットを返品したいです。",
    "表紙に傷があったので交換をお願いします。",
    "ご注文の商品は月曜日に発送され、三営業日以内に到着予定です。",
    "返金は元のお支払い方法に五から七営業日で戻ります。",
    "追跡番号が十日間更新されていないので、担当者につないでください。",
    "ドラゴンボールの初版第1巻は在庫がありますか？",
    "ゆっくりした展開で絵が細かい青年マンガが好きです。",
    "恋愛ものは苦手なので、ラブコメは除いてください。",
    "アニメは原作の137話までを描いています。",
    "少年ジャンプの新しい話は毎週月曜日の0時に公開されます。",
    "ブルーロックの28巻はアクリルスタンド付きの限定版を予約受付中です。",
    "キングダムは何巻まで翻訳されていますか？",
    "推しの子は中学生が読んでも大丈夫ですか？",
    "ハイキュー!!に似たスポーツマンガを教えてください。",
    "ありがとうございます。2巻の価格も確認できますか？",
    "電子書籍版には紙の本の特典ページも含まれています。",
    "モンスターは新しい読者にはどの版がおすすめですか？",
    "ダークファンタジーが好きな人におすすめのマンガはありますか？",
)

SYSTEM_PROMPT_EN = (
    "You are MangaAssist, the shopping assistant of a manga store. Answer briefly, name real "
    "titles only, and answer in the customer's language."
)
SYSTEM_PROMPT_JA = (
    "あなたはマンガ専門店のショッピングアシスタント、MangaAssistです。実在する作品名だけを挙げ、"
    "お客様の言語で簡潔に答えてください。"
)


LLAMA3_BOS = "<|begin_of_text|>"
LLAMA3_EOT = "<|eot_id|>"
LLAMA3_SPECIAL_TOKENS: tuple[str, ...] = (
    LLAMA3_BOS,
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    LLAMA3_EOT,
)
"""The special tokens the chat template writes (BOS, end of text, the header marks, end of turn)."""

LLAMA3_INSTRUCT_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)
"""Meta-Llama-3-8B-Instruct's chat template, verbatim from its ``tokenizer_config.json``."""
