"""The demo corpus: hand-written sentences about NVIDIA GPUs and nvkit combined with vocabulary
lists into paragraphs, "NVIDIA GPUs are ..." lines and short ChatML chats. ``make_corpus`` wrote
the shipped ``corpus.txt`` (``python -m nvkit.demo.build --write-corpus`` writes it again); the
chat tokens are here because the chats are written in them."""

from __future__ import annotations

import random

EOS = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [EOS, IM_START, IM_END]

GPUS = ["the H100", "the H200", "an A100", "the B200", "an L4", "an L40S", "a T4", "a V100",
        "an RTX 4090", "an RTX 3090", "an A10G", "an RTX 6000 Ada", "a GH200", "an RTX 5090"]
GPU_MEM = {"the H100": "80 GB", "the H200": "141 GB", "an A100": "40 or 80 GB", "the B200": "192 GB",
           "an L4": "24 GB", "an L40S": "48 GB", "a T4": "16 GB", "a V100": "16 or 32 GB",
           "an RTX 4090": "24 GB", "an RTX 3090": "24 GB", "an A10G": "24 GB",
           "an RTX 6000 Ada": "48 GB", "a GH200": "96 GB", "an RTX 5090": "32 GB"}
GPU_ARCH = {"the H100": "Hopper", "the H200": "Hopper", "an A100": "Ampere", "the B200": "Blackwell",
            "an L4": "Ada Lovelace", "an L40S": "Ada Lovelace", "a T4": "Turing", "a V100": "Volta",
            "an RTX 4090": "Ada Lovelace", "an RTX 3090": "Ampere", "an A10G": "Ampere",
            "an RTX 6000 Ada": "Ada Lovelace", "a GH200": "Hopper", "an RTX 5090": "Blackwell"}
MODELS = ["a small language model", "the demo model", "a chat model", "a seven billion parameter model",
          "Qwen3-0.6B", "a Llama model", "a one billion parameter model", "a code model",
          "a large language model", "a tiny Qwen3 model", "an instruction tuned model"]
DTYPES = ["bfloat16", "float16", "float32"]
BACKENDS = ["sdpa", "FlashAttention 2", "FlashAttention 3", "FlashAttention 4", "eager attention"]
TASKS = ["text generation", "fine-tuning", "batched inference", "LoRA training", "evaluation",
         "long prompts", "chat", "benchmarks", "training runs", "serving many users"]

GPU_ARE = [
    # "NVIDIA GPUs are" + one of these, so the demo prompt has many real continuations
    "built for parallel work, so thousands of small cores run the same operation at once",
    "fast at matrix multiplication, which is most of the work inside a transformer",
    "the usual choice for training and running large language models",
    "well suited to deep learning because they move a lot of data every second",
    "programmed with CUDA, and PyTorch hides most of that work from you",
    "good at batched work: many prompts at once keep the cores busy",
    "found in laptops, desktops, cloud servers and large clusters",
    "listed by nvidia-smi in the order of their PCI bus",
    "limited by memory more often than by compute when you run a big model",
    "able to run bfloat16 math quickly from the Ampere generation onward",
    "much faster than the CPU for training, even for a small model",
    "shared between notebooks, so it helps to check who is using the memory",
    "connected with NVLink inside a server and with InfiniBand between servers",
    "the devices that CUDA_VISIBLE_DEVICES selects and renumbers",
    "where the model weights, the KV cache and the activations all have to fit",
    "driven by the CUDA driver, and the toolkit version must match what PyTorch expects",
    "easy to use from a notebook once the model is loaded on cuda",
    "fast when the batch is large enough to fill every streaming multiprocessor",
    "measured in memory, bandwidth and tensor core throughput",
    "useful for inference as well as training",
    "a good fit for attention kernels such as FlashAttention",
    "often idle while the CPU prepares the next batch, so the data loader matters",
    "happiest with long sequences of the same kind of work",
    "built around tensor cores that multiply small tiles of numbers in one step",
    "able to hold a quantized model that would not fit in full precision",
    "busy during prefill and waiting on memory during decoding",
    "split across processes by torchrun when one card is not enough",
    "the reason a notebook can fine-tune a model in minutes instead of hours",
    "fast, but only when the data is already on the device",
    "ordered differently by CUDA and by nvidia-smi unless you set CUDA_DEVICE_ORDER",
]

GPU_ARE_TAIL = [
    "That is why the demo runs on them.", "The kit shows this in the memory chart.",
    "A notebook can check this with nvkit.gpus().", "This matters for every model you load.",
    "Keep that in mind when you choose a batch size.", "The tutorials come back to this often.",
    "It is the first thing to check before a long run.", "Small models show the same effect.",
]

TOPIC_SENTENCES: dict[str, list[str]] = {
    "cuda": [
        "CUDA is the programming platform that lets software run on NVIDIA GPUs.",
        "PyTorch calls CUDA for you, so most notebooks never write a kernel by hand.",
        "A CUDA kernel is a small function that thousands of threads run at the same time.",
        "The CUDA context is created the first time a process touches the GPU.",
        "Creating the CUDA context takes some memory that PyTorch does not count as allocated.",
        "After the context exists, changing CUDA_VISIBLE_DEVICES has no effect in that process.",
        "Set CUDA_VISIBLE_DEVICES before the first CUDA call, or restart the kernel.",
        "With CUDA_DEVICE_ORDER set to PCI_BUS_ID, CUDA numbers the cards the way nvidia-smi does.",
        "If CUDA_VISIBLE_DEVICES is 2,0 then cuda:0 is the third card and cuda:1 is the first.",
        "An empty CUDA_VISIBLE_DEVICES hides every GPU, and the model runs on the CPU.",
        "torch.cuda.is_available tells you whether PyTorch can see a GPU at all.",
        "CUDA graphs record a sequence of kernels once and replay it with very little overhead.",
        "CUDA streams let copies and kernels overlap in time.",
        "The current CUDA device is set per thread, so a worker thread must set it again.",
        "A driver that is too old for the CUDA build of PyTorch is a common reason for errors.",
        "NVML reads the GPU list without creating a CUDA context.",
        "nvidia-smi shows the driver version, the memory in use and the running processes.",
        "Each CUDA device has its own memory, and tensors must be moved there before use.",
        "Moving a tensor to the GPU is a copy over PCIe or NVLink, and copies cost time.",
        "Pinned host memory makes copies to the GPU faster.",
    ],
    "jupyter": [
        "A notebook keeps the model in memory between cells, so you load it once and try many prompts.",
        "JupyterLab shows notebooks, terminals and files side by side.",
        "The kernel is the Python process behind the notebook.",
        "Restarting the kernel frees all GPU memory that the notebook held.",
        "A cell that blocks stops widget clicks from being served until it returns.",
        "A cell that awaits lets the kernel keep serving widgets, so the Stop button works.",
        "Long generation runs in a worker thread so the notebook stays responsive.",
        "The nvkit panel puts GPUs, model, generation, fine-tuning and memory in one place.",
        "Every panel can show the code it would run, so a click becomes a cell you can keep.",
        "The magic command %nvkit generate runs a prompt from a single line.",
        "Widgets are created in the main thread and updated by workers.",
        "Interrupt in the notebook reaches a blocking loop as KeyboardInterrupt.",
        "The tutorials are numbered notebooks, one topic each.",
        "A notebook is a good place to compare attention backends side by side.",
        "Output printed from a thread appears in whichever cell is running at that moment.",
        "Load the demo model first; it needs no download and runs on a CPU.",
        "The memory chart updates a few times per second while the model works.",
        "You can mark an event on the memory chart to see what a step cost.",
    ],
    "attention": [
        "Attention compares every token with the tokens before it.",
        "The cost of attention grows with the square of the sequence length.",
        "sdpa is the scaled dot product attention built into PyTorch and the default backend.",
        "sdpa picks a fast kernel on its own when the inputs allow it.",
        "FlashAttention computes attention in tiles so the full score matrix never sits in memory.",
        "FlashAttention 2 needs an Ampere GPU or newer.",
        "FlashAttention 3 is tuned for Hopper GPUs such as the H100 and the H200.",
        "FlashAttention 4 targets Hopper and Blackwell and is written with the CuTe DSL.",
        "Eager attention is the plain reference version and the slowest of the choices.",
        "You choose the backend with attn_implementation when you load the model.",
        "When the FlashAttention package is missing, transformers can fetch a kernel from the Hub instead.",
        "Offline, a Hub kernel cannot be fetched, and the error says so.",
        "Grouped query attention shares each key and value head between several query heads.",
        "Fewer key and value heads make the KV cache smaller.",
        "Switching the attention backend does not change the weights, only the kernel that runs.",
        "A faster attention kernel helps most when prompts are long.",
        "Padding wastes attention work, so continuous batching packs requests instead.",
    ],
    "kvcache": [
        "The KV cache stores the keys and values of earlier tokens so they are not computed again.",
        "During decoding each new token reads the whole KV cache.",
        "The KV cache grows with batch size, sequence length, layers and key value heads.",
        "For long prompts the KV cache can use more memory than the weights.",
        "A static cache keeps a fixed shape, which lets CUDA graphs replay the same kernels.",
        "A paged cache hands out memory in blocks as sequences grow.",
        "Continuous batching adds new requests as soon as old ones finish.",
        "Prefill processes the whole prompt at once; decoding adds one token at a time.",
        "Decoding is limited by memory bandwidth, prefill by compute.",
        "The cache for Qwen3-0.6B holds 28 layers of keys and values for every token.",
        "Halving the key value heads halves the size of the cache.",
        "Freeing the cache after generation returns memory to the allocator, not to the driver.",
    ],
    "quant": [
        "Quantization stores weights with fewer bits so a larger model fits in the same memory.",
        "A model in 8-bit needs about half the memory of the same model in bfloat16.",
        "A model in 4-bit needs about a quarter of the memory of the bfloat16 weights.",
        "bitsandbytes provides 8-bit and 4-bit linear layers for transformers.",
        "NF4 is a 4-bit data type shaped for weights that follow a normal distribution.",
        "FP4 is the other 4-bit choice in bitsandbytes.",
        "Double quantization also compresses the scaling constants and saves a little more memory.",
        "The compute dtype of a 4-bit model is usually bfloat16.",
        "A quantized model is a little less accurate, but often the difference is small.",
        "QLoRA trains LoRA adapters on top of a frozen 4-bit model.",
        "You pass a BitsAndBytesConfig as quantization_config when you load the model.",
        "Quantized weights are unpacked to the compute dtype inside each matrix multiplication.",
        "8-bit inference can be slower than bfloat16, because the unpacking is extra work.",
        "Quantization mainly helps when the model would not fit at all.",
    ],
    "lora": [
        "LoRA fine-tuning trains two small matrices beside each frozen linear layer.",
        "Only the LoRA adapters receive gradients, so the optimizer state stays small.",
        "The rank of a LoRA adapter sets how many parameters it adds.",
        "A rank of eight or sixteen is a common starting point.",
        "Target all linear layers, not only the query and value projections.",
        "PEFT adds LoRA adapters to a transformers model in a few lines.",
        "An adapter is saved as a small file and loaded on top of the base model later.",
        "Merging the adapter folds it into the weights so inference has no extra cost.",
        "A short LoRA run on the demo model finishes in a minute on a CPU.",
        "The learning rate for LoRA is usually higher than for full fine-tuning.",
        "Fine-tuning on a few hundred examples can change the style of the answers.",
        "Watch the loss: it should fall quickly at first and then level off.",
        "Unloading the adapter brings back the original model.",
    ],
    "memory": [
        "GPU memory holds the weights, the gradients, the optimizer state, the activations and the cache.",
        "A model with one billion parameters needs about two gigabytes in bfloat16.",
        "AdamW keeps two extra numbers for every trained parameter.",
        "Activations grow with batch size and sequence length.",
        "Gradient checkpointing saves memory by computing some activations again.",
        "PyTorch reserves memory in blocks and reuses them, so reserved memory stays high.",
        "torch.cuda.memory_allocated counts live tensors; memory_reserved counts the blocks PyTorch keeps.",
        "nvidia-smi shows more memory in use than PyTorch reports, because of the CUDA context and libraries.",
        "cuBLAS and NCCL keep workspaces that PyTorch does not count.",
        "Out of memory errors usually mean the batch or the sequence is too large.",
        "Empty the cache to give reserved memory back to the driver.",
        "An estimate is only useful next to the measurement it predicts.",
        "The memory report shows the driver view and the allocator view for each GPU.",
        "device_map auto spreads layers over the GPUs that are visible.",
        "max_memory caps how much each GPU may hold when the model is placed.",
    ],
    "batching": [
        "Batching runs several prompts together so the GPU does more useful work per step.",
        "A larger batch raises throughput until memory or compute runs out.",
        "Left padding keeps the newest tokens of every prompt aligned for generation.",
        "The pad token fills short prompts so the batch has one shape.",
        "Continuous batching keeps the GPU busy by replacing finished requests right away.",
        "The first token takes longer than the rest because the prompt is processed first.",
        "Throughput is tokens per second; latency is how long one request waits.",
        "A batch of one is simple but leaves most of the GPU idle.",
    ],
    "tokens": [
        "A tokenizer turns text into token ids and turns ids back into text.",
        "Byte-level BPE can encode any text, because every byte has a token.",
        "Common words become a single token, while rare words are split into pieces.",
        "The demo tokenizer has a small vocabulary learned from the demo corpus.",
        "Qwen3 uses a vocabulary of about one hundred and fifty thousand tokens.",
        "The end of text token tells generation where to stop.",
        "A chat template wraps each message with its role before the model sees it.",
        "The assistant turn begins after the generation prompt in the chat template.",
        "max_new_tokens limits how many tokens generation may add.",
        "Greedy decoding picks the most likely token at every step.",
        "Sampling with a temperature gives more varied text.",
        "The embedding table has one row for every token in the vocabulary.",
    ],
    "training": [
        "Training adjusts the weights to make the next token more likely.",
        "The loss is the cross entropy between the prediction and the real next token.",
        "bfloat16 training is the usual choice on Ampere GPUs and newer.",
        "Older GPUs train in float16 with a gradient scaler.",
        "The Trainer class runs the training loop, logging and checkpoints for you.",
        "Gradient accumulation adds up several small batches before one optimizer step.",
        "A warmup phase lets the learning rate rise slowly at the start.",
        "Checkpoints save the model so a long run can continue after a stop.",
        "torchrun starts one process per GPU for distributed training.",
        "DDP keeps a full copy of the model on every GPU and averages the gradients.",
        "FSDP shards weights, gradients and optimizer state across GPUs.",
        "DeepSpeed ZeRO also splits the optimizer state between processes.",
        "Tensor parallelism splits each large matrix across several GPUs.",
        "NCCL moves gradients between GPUs over NVLink or the network.",
        "accelerate launch starts the same script on one GPU or many.",
        "A tiny model trained for a few minutes can already write real words.",
    ],
    "kernels": [
        "Hub kernels are compiled GPU kernels that transformers can download and use.",
        "use_kernels=True swaps some layers for faster kernels when they are available.",
        "A KernelConfig maps layer names to kernels, with a separate entry for cuda.",
        "The kernels package must match the transformers version, or kernels are turned off.",
        "Without network access, kernels from the Hub cannot be loaded.",
        "A fused RMSNorm kernel does the whole normalization in one pass over memory.",
        "Fused kernels save time by reading memory once instead of several times.",
    ],
}

TEMPLATES = [
    "{gpu} has {mem} of memory, enough for {model} in bfloat16.",
    "{gpu} belongs to the {arch} generation.",
    "On {gpu}, {backend} is a sensible choice for {task}.",
    "{model} loads on {gpu} in a few seconds.",
    "For {task}, {gpu} with {backend} keeps the cores busy.",
    "In {dtype}, {model} uses less memory than in float32.",
    "{backend} gives the same answers as sdpa, only the speed changes.",
    "With {backend}, {task} on {gpu} gets faster as prompts get longer.",
    "A 4-bit copy of {model} fits on {gpu} with room left for the cache.",
    "An 8-bit copy of {model} needs about half the memory of bfloat16.",
    "Fine-tuning {model} with LoRA on {gpu} takes minutes, not hours.",
    "The memory chart shows {model} on {gpu} while it runs {task}.",
    "Before {task}, check that {gpu} has enough free memory.",
    "{arch} GPUs such as {gpu} run {dtype} math on tensor cores.",
    "Use {dtype} for {task} when {gpu} supports it.",
    "The KV cache of {model} grows with every token during {task}.",
    "nvkit.estimate predicts the memory that {model} needs for {task}.",
    "Load {model} with attn_implementation set to {backend_id}.",
    "{gpu} can serve {model} to several users with continuous batching.",
    "Quantizing {model} to NF4 lets it run on {gpu}.",
    "A batch of {batch} prompts with {seq} tokens each is a good test for {gpu}.",
    "With a batch size of {batch}, {model} runs {task} faster than one prompt at a time.",
    "A LoRA rank of {rank} adds only a small fraction of new parameters to {model}.",
    "Training {model} with sequences of {seq} tokens needs more memory for activations.",
    "If {gpu} runs out of memory, lower the batch size from {batch} to {half}.",
    "The tokenizer splits a prompt of {words} words into roughly {tokens} tokens.",
    "Generation of {tokens} new tokens from {model} takes well under a second on {gpu}.",
    "nvidia-smi lists {gpu} with {mem} of memory and the processes that use it.",
    "{gpu} and {gpu2} can both run {model}, but {gpu2} has {mem2} of memory.",
    "Select {gpu} first and {gpu2} second with nvkit.select_gpus.",
    "A notebook on {gpu} can load {model}, generate text and start a short LoRA run.",
    "Set device_map to cuda to put all of {model} on {gpu}.",
    "When {model} does not fit on {gpu}, device_map auto spreads it over more GPUs.",
    "The {arch} generation added faster tensor cores for {dtype}.",
    "Try {backend} and sdpa on {gpu} and compare the tokens per second.",
    "{task} with {model} is a good first exercise on {gpu}.",
    "With {dtype} weights, {model} leaves more room for the KV cache on {gpu}.",
    "The bench panel runs {model} with {backend} and with sdpa, then shows both results.",
    "Memory for {task} is weights plus cache plus activations, and {gpu} has {mem} in total.",
    "A short fine-tune of {model} with a learning rate of {lr} and {steps} steps is enough to see the loss fall.",
]

BACKEND_ID = {"sdpa": "sdpa", "FlashAttention 2": "flash_attention_2",
              "FlashAttention 3": "flash_attention_3", "FlashAttention 4": "flash_attention_4",
              "eager attention": "eager"}

CHATS = [
    ("What are NVIDIA GPUs good at?",
     "NVIDIA GPUs are good at parallel work such as the matrix multiplications inside a transformer."),
    ("Why is my model slow on the CPU?",
     "The CPU has few cores. Load the model on cuda and the same work runs much faster."),
    ("How do I pick a GPU?",
     "Set CUDA_VISIBLE_DEVICES before the first CUDA call, or use nvkit.select_gpus in the notebook."),
    ("What is the KV cache?",
     "The KV cache keeps the keys and values of earlier tokens so each new token does less work."),
    ("Which attention backend should I use?",
     "Start with sdpa. On Ampere or newer you can try FlashAttention for long prompts."),
    ("My model does not fit in memory. What can I do?",
     "Load it in 4-bit with bitsandbytes, or use a smaller batch and shorter prompts."),
    ("What is LoRA?",
     "LoRA trains small adapter matrices next to frozen weights, so fine-tuning needs little memory."),
    ("How much memory does a one billion parameter model need?",
     "About two gigabytes in bfloat16, plus room for the KV cache and the activations."),
    ("Why does nvidia-smi show more memory than PyTorch?",
     "The CUDA context and libraries such as cuBLAS use memory that PyTorch does not count."),
    ("What is 4-bit quantization?",
     "It stores each weight with four bits, so the model takes about a quarter of the memory."),
    ("Can I run the demo model without a GPU?",
     "Yes. The demo model is tiny and runs on the CPU with no download."),
    ("What does bfloat16 mean?",
     "bfloat16 is a 16-bit number format with the range of float32 and less precision."),
    ("How do I stop a long generation?",
     "Press Stop in the panel, or await the call so the notebook can serve the button."),
    ("What is continuous batching?",
     "It adds new requests to the batch as soon as others finish, so the GPU stays busy."),
    ("Hello!", "Hello! Ask me about GPUs, CUDA, attention or fine-tuning."),
    ("Who are you?", "I am the nvkit demo model, a tiny Qwen3 model trained on a short text about GPUs."),
    ("What is a token?", "A token is a piece of text, often a word or part of a word, with its own id."),
    ("How do I train on several GPUs?",
     "Launch the script with torchrun, one process per GPU, and NCCL moves the gradients."),
    ("What is FlashAttention?",
     "FlashAttention computes attention in tiles so it reads memory less and runs faster."),
    ("Should I use float16 or bfloat16?",
     "Use bfloat16 on Ampere GPUs and newer. Older GPUs use float16 with a gradient scaler."),
    ("Thanks!", "You are welcome. Have fun with your GPUs."),
    ("What is a notebook kernel?",
     "It is the Python process behind the notebook. It keeps the model loaded between cells."),
    ("How do I see GPU memory?",
     "Open the memory chart, or call nvkit.memory_report for the driver and allocator views."),
    ("What does device_map auto do?",
     "It places the layers of the model on the visible GPUs, and on the CPU if they are full."),
]

SYSTEMS = ["You are a helpful assistant.", "You answer questions about NVIDIA GPUs.",
           "You are the nvkit demo assistant. Keep answers short."]


def make_corpus(seed: int = 0, target_bytes: int = 220_000) -> str:
    """The demo corpus: topic paragraphs, "NVIDIA GPUs are ..." lines and short chats."""
    rng = random.Random(seed)

    def fill(template: str) -> str:
        gpu = rng.choice(GPUS)
        backend = rng.choice(BACKENDS)
        gpu2 = rng.choice([g for g in GPUS if g != gpu])
        batch = rng.choice([4, 8, 16, 32, 64])
        words = rng.choice([10, 20, 50, 100, 200])
        text = template.format(gpu=gpu, mem=GPU_MEM[gpu], arch=GPU_ARCH[gpu], model=rng.choice(MODELS),
                               gpu2=gpu2, mem2=GPU_MEM[gpu2], dtype=rng.choice(DTYPES), backend=backend,
                               backend_id=BACKEND_ID[backend], task=rng.choice(TASKS), batch=batch,
                               half=batch // 2, seq=rng.choice([128, 256, 512, 1024, 2048, 4096]),
                               rank=rng.choice([4, 8, 16, 32, 64]), words=words, tokens=words * 4 // 3,
                               lr=rng.choice(["1e-4", "2e-4", "5e-4", "1e-3"]),
                               steps=rng.choice([50, 100, 200, 500]))
        # "the H100 has ..." opens a sentence; "nvkit.estimate ..." stays as code is spelled
        return text[0].upper() + text[1:] if text.startswith(("the ", "a ", "an ")) else text

    def gpus_are() -> str:
        line = f"NVIDIA GPUs are {rng.choice(GPU_ARE)}."
        if rng.random() < 0.35:
            line += " " + rng.choice(GPU_ARE_TAIL)
        return line

    def chat() -> str:
        turns = []
        if rng.random() < 0.4:
            turns.append(f"{IM_START}system\n{rng.choice(SYSTEMS)}{IM_END}")
        for q, a in rng.sample(CHATS, k=rng.choice([1, 1, 2])):
            turns.append(f"{IM_START}user\n{q}{IM_END}")
            turns.append(f"{IM_START}assistant\n{a}{IM_END}")
        return "\n".join(turns)

    topics = sorted(TOPIC_SENTENCES)
    out: list[str] = []
    size = 0
    while size < target_bytes:
        kind = rng.random()
        if kind < 0.15:
            para = chat()
        else:
            sentences: list[str] = []
            if kind < 0.55:
                sentences.append(gpus_are())
            topic = rng.choice(topics)
            for s in rng.sample(TOPIC_SENTENCES[topic], k=min(len(TOPIC_SENTENCES[topic]), rng.randint(2, 4))):
                sentences.append(s)
            for _ in range(rng.randint(1, 3)):
                sentences.append(fill(rng.choice(TEMPLATES)))
            if rng.random() < 0.3:
                sentences.append(gpus_are())
            para = " ".join(sentences)
        out.append(para)
        size += len(para) + 2
    return "\n\n".join(out) + "\n"
