"""The public request fields are the ensemble's inputs (``package.contract``): the Python client's request and the
OpenAI API's extra fields name inputs the contract declares, and a public input the client cannot set is one it
leaves out on purpose. A new input added to the contract without its client field fails here."""

from __future__ import annotations

from dataclasses import fields

from specbuild.package.contract import ENSEMBLE_INPUTS, ORCHESTRATOR_INPUTS
from specbuild.serve.client import GenerationRequest, _INPUT_NAMES
from specbuild.serve.openai_requests import ChatRequest, CompletionRequest

# Inputs of NVIDIA's contract the Python client does not set: older spellings of its own fields (min_length and
# random_seed for min_tokens and seed), NVIDIA's beam and multi-sequence inputs the orchestrator refuses above 1,
# the outputs every response carries anyway, and the pad token the tokenizer gives.
NOT_FROM_THE_CLIENT = {"min_length", "random_seed", "beam_width", "length_penalty", "num_return_sequences",
                       "return_num_input_tokens", "return_num_output_tokens", "return_perf_metrics", "pad_id"}
# OpenAI request fields the orchestrator's inputs do not carry under the same name: OpenAI's own (the prompt and
# messages, stop strings and streaming are encoded by the API itself; n, logit_bias, ... are refused)
OPENAI_OWN = {"model", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options", "stop", "seed",
              "presence_penalty", "frequency_penalty", "logit_bias", "user", "prompt", "echo", "suffix", "logprobs",
              "best_of", "messages", "max_completion_tokens", "top_logprobs", "response_format", "tools", "tool_choice",
              "parallel_tool_calls", "functions", "function_call"}


def test_every_client_field_is_an_ensemble_input_and_every_input_is_a_field_or_left_out_on_purpose():
    client = {_INPUT_NAMES.get(field.name, field.name) for field in fields(GenerationRequest)}
    inputs = {tensor.name for tensor in ENSEMBLE_INPUTS}
    assert client <= inputs, f"client fields the ensemble does not declare: {sorted(client - inputs)}"
    assert inputs - client == NOT_FROM_THE_CLIENT, "a public input without its field in serve.client"


def test_every_openai_extra_field_is_an_orchestrator_input_it_sends():
    inputs = {tensor.name for tensor in ORCHESTRATOR_INPUTS}
    chat = ChatRequest(model="m", messages=[{"role": "user", "content": "x"}])
    for request in (CompletionRequest(model="m", prompt="x"), chat):
        extras = set(type(request).model_fields) - OPENAI_OWN
        sent = set(request.settings())
        assert sent <= inputs, f"settings the orchestrator does not declare: {sorted(sent - inputs)}"
        assert extras <= sent, f"extra fields never sent: {sorted(extras - sent)}"
