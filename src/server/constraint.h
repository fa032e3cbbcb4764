/* server/constraint.h — constrained output for one request, as the sampler's
 * constraint (model/sampler.h). Two kinds:
 *   - a JSON grammar (text/json_grammar.h) read at the token level: a token is
 *     allowed when its bytes keep the text a prefix of an allowed document; an
 *     end-of-sequence token only when the document is complete; other special
 *     tokens never. Beside tools the reply is either the document or tool
 *     calls: "<tool_call>" may open the reply (a document has no whitespace
 *     before it either: json_grammar.h), a call's body is free, and after "</tool_call>" only whitespace, another
 *     call or the end may follow (OpenAI's rule: the schema binds the content,
 *     not the calls);
 *   - a thinking budget: once the reasoning has taken `budget` tokens without
 *     closing, the next tokens are forced — the closing text Qwen's guidance
 *     uses ("\n\nConsidering the limited time by the user, I have to give the
 *     solution based on the thinking directly now.\n</think>\n\n") — and the
 *     reply goes on as content, unconstrained.
 *
 * Owned by the job (sched.h), used by its sampler on whichever scheduler
 * thread samples it, one at a time. Per step the bytes each token may start
 * with are worked out once (256 feeds), so most tokens of the vocabulary are
 * turned away by one table lookup, without copying the parse state; what
 * depends only on the vocabulary (which tokens are special, which are runs of
 * plain string characters and how many) is one out_vocab, built when the
 * model is loaded and shared by every request.
 */
#ifndef ORCHID_SERVER_CONSTRAINT_H
#define ORCHID_SERVER_CONSTRAINT_H

#include "model/sampler.h"
#include "server/port.h"
#include "text/json_grammar.h"

struct out_constraint;
struct out_vocab;

/* The vocabulary's table (a byte a token: special, a run of plain string
 * characters and how many, or neither). port must outlive it. Returns 0 or
 * ST_NOMEM. */
int out_vocab_new(struct out_vocab **out, const struct model_port *port);
void out_vocab_free(struct out_vocab *v);

/* Takes ownership of g (freed with the constraint, or here on failure). v (of
 * the same port) must outlive the constraint. tools: OUT_TOOLS_NONE (the
 * document only), OUT_TOOLS_EITHER (the document or tool calls) or
 * OUT_TOOLS_IN_CALL (the reply starts inside an opened call: a forced tool
 * choice). Returns 0, ST_NOMEM, or ST_INVALID (tools asked for, and the model
 * has no single "<tool_call>" / "</tool_call>" tokens). */
enum { OUT_TOOLS_NONE = 0, OUT_TOOLS_EITHER, OUT_TOOLS_IN_CALL };
int out_constraint_new(struct out_constraint **out, jg_grammar *g, const struct out_vocab *v, int tools);
/* A thinking budget for a reply that starts inside reasoning. The forced text
 * is encoded here (port->encode). Returns 0, ST_NOMEM or ST_INVALID (the
 * model has no single "</think>" token). */
int out_constraint_new_budget(struct out_constraint **out, int budget, const struct model_port *port);
void out_constraint_free(struct out_constraint *c);
struct sampler_constraint out_constraint_sampler(struct out_constraint *c);

#endif
