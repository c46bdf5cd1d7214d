/// Client response to a `connection.secure` challenge, providing the SASL response data.
