package silverkeys;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import com.fasterxml.jackson.core.json.JsonReadFeature;

import org.apache.spark.sql.api.java.UDF2;

/**
 * (record's JSON text, contract spec), both as UTF-8 bytes -> whether the record may have a key
 * the contract does not declare at a level it checks. One streaming scan: no value is built, and
 * it stops at the first undeclared key. Registered as silver_undeclared_keys by
 * silver/contract.py, which builds the spec and reads the record a second time (each level as a
 * map of key -> VARIANT) only where this says true.
 *
 * <p>Bytes, not strings: Spark hands a BINARY column over as its bytes, where a STRING is decoded
 * into a Java String per row (and the literal spec with it), and Jackson scans UTF-8 bytes faster
 * than chars.
 *
 * <p>The answer may be a false positive, never a false negative: text that is not one JSON
 * object, or that this parser rejects, says true, and the second read then decides as it did for
 * every record before this function existed.
 *
 * <p>The spec is a tree of JSON objects, one per level of the record: {"keys": [declared names]
 * (absent: the level is not checked), "children": {name: node} (the levels below that are
 * walked), "items": node (the level is a collection, an array or an object used as a map, and
 * each of its values is such a node)}.
 */
public final class UndeclaredKeys implements UDF2<byte[], byte[], Boolean> {
    private static final long serialVersionUID = 1L;
    /** What Spark's JSON reader accepts by default (JSONOptions): single quotes, NaN and Infinity. */
    private static final JsonFactory JSON = JsonFactory.builder()
            .enable(JsonReadFeature.ALLOW_SINGLE_QUOTES)
            .enable(JsonReadFeature.ALLOW_NON_NUMERIC_NUMBERS)
            .build();

    /** The spec parsed last, with its text: every row of a query carries the same literal. */
    private transient volatile Parsed last;

    private record Parsed(byte[] text, Node root) {}

    private static final class Node {
        Set<String> keys;                        // null: any key
        final Map<String, Node> children = new HashMap<>();
        Node items;                              // non-null: a collection of such nodes
    }

    @Override
    public Boolean call(byte[] record, byte[] spec) throws IOException {
        if (record == null) {
            return null;
        }
        Node root = root(spec);
        try (JsonParser p = JSON.createParser(record)) {
            JsonToken t = p.nextToken();
            return t != JsonToken.START_OBJECT || object(p, root);
        } catch (IOException e) {
            return true;
        }
    }

    private Node root(byte[] spec) throws IOException {
        Parsed parsed = last;
        // A literal reaches every row as the same array: compared by content only when it is not.
        if (parsed == null || (parsed.text != spec && !Arrays.equals(parsed.text, spec))) {
            try (JsonParser p = JSON.createParser(spec)) {
                if (p.nextToken() != JsonToken.START_OBJECT) {
                    throw new IllegalArgumentException("silver_undeclared_keys: the spec is not a JSON object: "
                            + new String(spec, StandardCharsets.UTF_8));
                }
                parsed = new Parsed(spec, node(p));
            }
            last = parsed;
        }
        return parsed.root;
    }

    /** A spec node; the parser is on its START_OBJECT, and is left on its END_OBJECT. */
    private static Node node(JsonParser p) throws IOException {
        Node n = new Node();
        while (p.nextToken() == JsonToken.FIELD_NAME) {
            String field = p.currentName();
            JsonToken t = p.nextToken();
            switch (field) {
                case "keys" -> {
                    n.keys = new HashSet<>();
                    while (p.nextToken() == JsonToken.VALUE_STRING) {
                        n.keys.add(p.getText());
                    }
                }
                case "children" -> {
                    while (p.nextToken() == JsonToken.FIELD_NAME) {
                        String name = p.currentName();
                        p.nextToken();
                        n.children.put(name, node(p));
                    }
                }
                case "items" -> n.items = node(p);
                default -> throw new IllegalArgumentException("silver_undeclared_keys: unknown spec field " + field
                        + " (" + t + ")");
            }
        }
        return n;
    }

    /** Whether an object (the parser on its START_OBJECT) has an undeclared key; true returns early. */
    private static boolean object(JsonParser p, Node n) throws IOException {
        while (p.nextToken() == JsonToken.FIELD_NAME) {
            String key = p.currentName();
            JsonToken t = p.nextToken();
            if (n.keys != null && !n.keys.contains(key)) {
                return true;
            }
            Node child = n.children.get(key);
            if (child == null) {
                p.skipChildren();
            } else if (value(p, t, child)) {
                return true;
            }
        }
        return false;
    }

    /** A value at node n's level: walked if it has the shape n expects, else skipped (silver's
     *  typed read gives a value of the wrong shape its own reason). */
    private static boolean value(JsonParser p, JsonToken t, Node n) throws IOException {
        if (n.items == null) {
            if (t == JsonToken.START_OBJECT) {
                return object(p, n);
            }
            p.skipChildren();
            return false;
        }
        if (t == JsonToken.START_ARRAY) {
            while ((t = p.nextToken()) != JsonToken.END_ARRAY) {
                if (t == null) {
                    return true;
                }
                if (value(p, t, n.items)) {
                    return true;
                }
            }
            return false;
        }
        if (t == JsonToken.START_OBJECT) {
            while (p.nextToken() == JsonToken.FIELD_NAME) {
                if (value(p, p.nextToken(), n.items)) {
                    return true;
                }
            }
            return false;
        }
        p.skipChildren();
        return false;
    }
}
