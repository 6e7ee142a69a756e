"""A Hugging Face ``Trainer`` script as a user writes it: a tiny GPT-2 built from a config (no hub, no
network), a tiny in-memory dataset, ``Trainer(...).train()``. Nothing in it knows about shoal.

Usage: torchrun --nproc-per-node 2 hf_trainer.py RESULTS.jsonl [OUTPUT_DIR]
Each rank appends one JSON line to RESULTS.jsonl: its rank, the world size it saw, and that it finished.
"""

import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class TinyText(torch.utils.data.Dataset):
    def __init__(self, n=16, length=16, vocab=64):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def report(path, **fields):
    with open(path, "a") as f:  # one write per rank: lines from several ranks never interleave
        f.write(json.dumps(fields) + "\n")


def main():
    results = sys.argv[1]
    output_dir = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="hf-trainer-")
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    args = TrainingArguments(
        output_dir=output_dir,
        per_device_train_batch_size=2,
        max_steps=3,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        dataloader_num_workers=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=TinyText())
    out = trainer.train()
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    report(
        results,
        library="transformers",
        rank=dist.get_rank() if dist.is_initialized() else 0,
        world_size=dist.get_world_size() if dist.is_initialized() else 1,
        library_world_size=args.world_size,
        library_rank=args.process_index,
        steps=out.global_step,
        checksum=checksum,
        finished=True,
        pid=os.getpid(),
    )


if __name__ == "__main__":
    main()
