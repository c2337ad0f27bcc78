"""The special token ids, fixed for every SentencePiece model this project trains.

    PAD_ID = 0   padding, never attended to and ignored by the loss
    UNK_ID = 1   unknown piece
    BOS_ID = 2   start of a target sentence (decoder input only)
    EOS_ID = 3   end of a sentence (appended to source and target)

They sit below both the data path (nmt.tokenizer trains its models with them, nmt.data pads and starts
sentences with them) and the model (the embeddings' padding, the loss, search), so that neither imports the
other for them. nmt.tokenizer re-exports them.
"""

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
